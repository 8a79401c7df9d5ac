"""Differential privacy: its options (options.py). The noise and the accountant are in
`federation/privacy.py` and `federation/secure_sum.py` for now."""
