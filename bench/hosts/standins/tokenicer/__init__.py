"""Stand-in for Tokenicer: the Hugging Face tokenizer it wraps, reachable as .tokenizer
and by attribute."""
import transformers


class Tokenicer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, pretrained, model_config=None, trust_remote_code=False, **kwargs):
        if isinstance(pretrained, transformers.PreTrainedTokenizerBase):
            return cls(pretrained)
        return cls(transformers.AutoTokenizer.from_pretrained(pretrained, trust_remote_code=trust_remote_code))

    def __getattr__(self, name):
        if name == "tokenizer":
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)
