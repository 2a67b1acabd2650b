"""The parameter-server machinery that Downpour, SSP, async EASGD and the hierarchical server share
(see algorithms/__init__.py)."""
