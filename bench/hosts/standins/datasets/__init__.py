"""Stand-in for Hugging Face datasets: the names AutoRound and GPTQModel import; there is
no hub to load from (the runs pass their calibration as token tensors)."""


class Dataset(list):
    pass


class IterableDataset(list):
    pass


class DatasetDict(dict):
    pass


class IterableDatasetDict(dict):
    pass


def Features(*args, **kwargs):
    return dict(*args, **kwargs)


def Sequence(*args, **kwargs):
    return ("Sequence", args, kwargs)


def Value(*args, **kwargs):
    return ("Value", args, kwargs)


def concatenate_datasets(datasets, **kwargs):
    return Dataset(item for d in datasets for item in d)


def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets stand-in: no hub on this machine (load_dataset%r)" % (args,))
