"""``rpm digits``: self-supervised learning on scikit-learn's 8x8 digits, scored by label
efficiency (:mod:`rpm.experiments.digits.command`)."""
