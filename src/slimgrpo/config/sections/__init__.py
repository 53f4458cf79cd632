"""The sections of the config tree, one typed dataclass each (the root, ``Config``, is ``config/tree.py``)."""
