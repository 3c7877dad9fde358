"""Stand-in for auto_round.logger."""
import logging

logger = logging.getLogger("auto_round")
logger.infoclean = logger.info
