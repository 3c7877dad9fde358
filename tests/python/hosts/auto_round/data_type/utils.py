"""Stand-in for auto_round.data_type.utils: a weight's rows cut into groups of group_size
columns (the stand-in takes only group sizes that divide the columns)."""


def reshape_pad_tensor_by_group_size(data, group_size, val=0.0):
    """(data as (groups, group_size) rows, its shape, the padding: 0)."""
    return (data if group_size == -1 else data.reshape(-1, group_size)), data.shape, 0
