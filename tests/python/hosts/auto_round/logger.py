"""Stand-in for auto_round.logger."""
import logging

logger = logging.getLogger("auto_round")
logger.infoclean = logger.info
_said = set()


def _warning_once(message):
    if message not in _said:
        _said.add(message)
        logger.warning(message)


logger.warning_once = _warning_once
