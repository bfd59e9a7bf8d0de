"""The HF model inside a wrapper: one place that knows peft's (a leaf, so that every training module can use it)."""


def base_model(model):
    """The HF model inside a peft wrapper (adapters injected in its modules), or `model` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
