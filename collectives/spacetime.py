"""Space-time diagrams of traced messages: ranks as rows, time left to right, an arrow per message.

    traced = trace.TracedComm(MPI.COMM_WORLD)
    ring.allreduce(traced, grad, total)
    messages = trace.gather(traced)              # every rank's records, on rank 0 (None elsewhere)
    if messages is not None:
        plot_spacetime(messages, "ring.png")                       # the wall clock, in microseconds
        plot_spacetime(messages, "ring_steps.png", clock="steps")  # the schedule, one column per step

collectives.trace records the messages (and pairs each send with its receive, trace.match);
this module only draws them. The wall clock shows what a run took, noise and all; the logical
clock (`logical_times`) shows the schedule as the papers draw it: every call takes one slot
and a message one slot, so a rank waits exactly where the algorithm makes it wait.

    mpiexec -n 4 python -m collectives.ring --png ring.png       # one traced allreduce, drawn
"""
from .trace import match


def logical_times(messages):
    """Start slot of each call when every call takes one slot and a message takes one slot.

    A rank's calls happen in order; a call that receives cannot start before the call that
    sent it (it ends one slot later). Returns {(rank, tag, step): slot}; the diagram with
    clock="steps" uses it to draw the schedule as the papers do, free of timing noise.
    """
    calls = {}
    for m in messages:
        calls.setdefault(m.rank, [])
        key = (m.rank, m.tag, m.step)
        if key not in calls[m.rank]:
            calls[m.rank].append(key)
    sender_of = {(r.rank, r.tag, r.step): (s.rank, s.tag, s.step) for s, r in match(messages)}
    slot = {key: 0 for keys in calls.values() for key in keys}
    changed = True
    while changed:
        changed = False
        for keys in calls.values():
            for i, key in enumerate(keys):
                earliest = slot[keys[i - 1]] + 1 if i else 0
                if key in sender_of:
                    earliest = max(earliest, slot[sender_of[key]])
                if earliest > slot[key]:
                    slot[key], changed = earliest, True
    return slot


WIDTH = 5.0          # plot_spacetime: arrow width (points) of a message as big as the whole vector


def plot_spacetime(messages, path, title=None, clock="wall", full=None):
    """Space-time diagram as a PNG: ranks as rows, time left to right, an arrow per message.

    clock="wall": arrows from a send's start to its receive's end, in microseconds.
    clock="steps": the logical schedule (logical_times), one column per step.
    An arrow's width is proportional to its message's bytes, on one scale for every figure that
    passes the same `full` (the whole vector's bytes; default the largest message): width
    WIDTH at full, and a legend of the sizes drawn.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = match(messages)
    ranks = sorted({m.rank for m in messages} | {m.peer for m in messages}) or [0]
    phases = list(dict.fromkeys(send.phase for send, _ in pairs))
    colours = dict(zip(phases, plt.get_cmap("tab10").colors))
    if clock == "steps":
        slot = logical_times(messages)

        def x_of(send, recv):
            return slot[(send.rank, send.tag, send.step)], slot[(recv.rank, recv.tag, recv.step)] + 1
        xlabel = "step"
    else:
        def x_of(send, recv):
            return send.start * 1e6, recv.end * 1e6
        xlabel = "time (us)"
    full = full or max((send.nbytes for send, _ in pairs), default=1) or 1

    def width(nbytes):
        return max(0.4, WIDTH * nbytes / full)

    figure, axes = plt.subplots(figsize=(8, 0.6 * len(ranks) + 1.4))
    right = 1.0
    for send, recv in pairs:
        x0, x1 = x_of(send, recv)
        right = max(right, x1)
        axes.annotate("", xy=(x1, recv.rank), xytext=(x0, send.rank),
                      arrowprops=dict(arrowstyle="->", color=colours[send.phase], lw=width(send.nbytes),
                                      shrinkA=0, shrinkB=0))
    for rank in ranks:
        axes.axhline(rank, color="0.8", lw=0.8, zorder=0)
    for phase in phases:
        axes.plot([], [], color=colours[phase], label=phase)
    for nbytes in sorted({send.nbytes for send, _ in pairs}, reverse=True):
        size = f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"
        axes.plot([], [], color="0.3", lw=width(nbytes), label=f"{size} ({nbytes / full:.3g} of vector)")
    axes.set_xlim(-0.02 * right, 1.02 * right)
    axes.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
    axes.set_yticks(ranks, [f"rank {rank}" for rank in ranks])
    axes.set_xlabel(xlabel)
    if phases:
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axes.set_title(title or "")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
