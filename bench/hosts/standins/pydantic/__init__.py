"""Stand-in for pydantic: BaseModel classes that take their fields as keyword arguments
(AutoRound's rotation configs are defined with it; no validation)."""


def Field(default=None, **kwargs):
    return default


def field_validator(*fields, **kwargs):
    return lambda fn: fn


model_validator = field_validator
ConfigDict = dict


class PydanticUserError(Exception):
    pass


class ValidationError(ValueError):
    pass


class BaseModel:
    model_config = {}

    def __init__(self, **data):
        for name, value in data.items():
            setattr(self, name, value)

    def model_dump(self, **kwargs):
        fields = {k: v for k, v in vars(type(self)).items() if not k.startswith("_") and not callable(v)}
        return dict(fields, **vars(self))
