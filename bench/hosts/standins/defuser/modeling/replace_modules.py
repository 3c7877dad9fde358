def materialize_model(model, *args, **kwargs):
    return model
