"""Stand-in for auto_round.data_type: the int quant-dequant functions."""
