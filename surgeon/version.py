"""surgeon's version: one place, read by the package, the command line (`surgeon --version`), every manifest
and the build (pyproject.toml's dynamic version)."""
__version__ = "0.2.0"
