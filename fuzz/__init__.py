"""Fuzzing of the pure parts of the proxy: shared invariants (``checks``) and atheris harnesses."""
