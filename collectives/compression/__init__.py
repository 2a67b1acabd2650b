"""Communicating less: gradient compressors, quantizers, and the sparse allreduce.

    compress.py  the compressors' interface (``compress``, ``decompress``, ``wire_bytes``), the
                 sparsifiers (top-k, random-k), ``make(name, ...)`` and error feedback
    quantize.py  the quantizers: QSGD, stochastic rounding, TernGrad, 1-bit; codes packed into bytes
    sparse.py    SparCML's sparse allreduce of (index, value) pairs, dense once that is cheaper, and
                 the allgather of fixed-size quantized messages

    from collectives.compression import compress, sparse
    feedback = compress.ErrorFeedback(compress.make("topk", density=0.01))
"""
