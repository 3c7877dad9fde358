"""Stand-in for gptqmodel.nn_modules.qlinear.pack_block_ext: GPTQModel's native CPU packer,
absent here as it is wherever its extension was not built (it raises, and pack_block packs
in Python)."""


def pack_block_cpu(weight, scales, zeros, g_idx, bits, word_bits, block_in, threads):
    raise RuntimeError("pack_block_cpu extension unavailable")
