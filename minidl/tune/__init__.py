"""``python -m minidl.tune``: the choices that decide speed, measured on this machine, written to the tuning file.

    python -m minidl.tune                      # minidl's conv choices, then collectives' (a few minutes)
    python -m minidl.tune --out tuning.json    # another file (read it with MINIDL_TUNING=tuning.json)
    python -m minidl.tune --no-collectives     # minidl's part only

What it writes, where, and how minidl and collectives read it: ``minidl/tuning.py``.

    conv.py       the conv kernel's choices, each a race of candidates in interleaved rounds
    __main__.py   the command line: a worker process for the races (one BLAS thread, the shipped
                  defaults), the minidl section written, then collectives' own tuning run as a program
"""
