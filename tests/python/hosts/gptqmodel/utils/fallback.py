"""Stand-in for gptqmodel.utils.fallback: a sample-count threshold below which GPTQ falls
back to a simpler strategy."""


def should_use_fallback(setting, observed_samples, expected_total_samples=None):
    threshold = getattr(setting, "threshold", setting)
    return threshold is not None and threshold is not False and observed_samples < float(threshold)
