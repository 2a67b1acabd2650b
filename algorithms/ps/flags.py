"""The parameter-server family's own flags, written once: Downpour SGD and stale-synchronous SGD offer
them all, asynchronous EASGD the ones it honours (a flag an algorithm cannot honour is not offered).

    parser = flags.add_server_flags(cli.parser(...))                       # every one
    parser = flags.add_server_flags(cli.parser(...), "--servers", "--deterministic")
    cli.run_main(train, args, **flags.server_flags(args))                   # those the parser has
"""
SERVER_FLAGS = {
    "--servers": dict(type=int, default=1, help="parameter-server ranks (0 .. S-1)"),
    "--server-optimizer": dict(default="adagrad", choices=["sgd", "adagrad"]),
    "--deterministic": dict(action="store_true",
                            help="serve workers in a seeded order; the run is replayable from its log"),
    "--fail-worker": dict(type=int, default=None, help="rank of a worker that goes silent"),
    "--fail-step": dict(type=int, default=None, help="the step at which it does"),
    "--timeout": dict(type=float, default=10.0, help="seconds of silence after which server 0 drops a worker"),
}


def add_server_flags(parser, *names):
    """``parser`` with the named server flags (all of them if none is named)."""
    for name in names or SERVER_FLAGS:
        parser.add_argument(name, **SERVER_FLAGS[name])
    return parser


def server_flags(args):
    """The server flags ``args`` has, as keyword arguments for ``train``."""
    names = (name.removeprefix("--").replace("-", "_") for name in SERVER_FLAGS)
    return {name: getattr(args, name) for name in names if hasattr(args, name)}
