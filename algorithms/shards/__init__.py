"""How the memory-saving methods cut a model's state across ranks (ZeRO's units, the spatial split's
tiles, the locally connected regions), shared by those algorithms and by algorithms.memory's accounts;
nothing in it imports a paper module:

    units.py       ZeRO's gathering units, the blocks a rank keeps of each, and their moments (gather, reduce)
    tiling.py      feature maps cut into row tiles across ranks (the spatial split, and its memory account)
    regions.py     a rank's region of a locally connected network: the weights of its rows (the spatial split)
"""
