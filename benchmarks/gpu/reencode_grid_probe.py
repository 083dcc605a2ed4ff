"""Do the re-encode's per-tile and compact grids give the same nvfp4 / fp8 bytes on this device, and the torch codec's?
(Run 169 probe: on the H200 a Mamba-2 test found the per-tile grid's nvfp4 bytes differing from the compact grid's
for a [4, 4, 24, 20] state.) Prints, per shape and format, the number of differing bytes per entry."""

import torch

from hf_replayssm.kernels.read_copy_encode import reencode_read_copy
from hf_replayssm.precision.formats import get_format


def bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def main():
    gen = torch.Generator().manual_seed(0)
    for shape in [(4, 4, 24, 20), (4, 4, 24, 32), (4, 4, 32, 32), (2, 8, 64, 128), (4, 4, 24, 48)]:
        state = (torch.randn(*shape, generator=gen) * 3).cuda()
        select = torch.ones(shape[0], dtype=torch.bool, device="cuda")
        for fmt in ("fp8", "nvfp4"):
            want = get_format(fmt).encode(state)
            arms = {}
            arms_run = [("per_tile", None, None), ("compact", 16, None), ("compact3", 3, None)]
            if fmt == "nvfp4":  # the block scales by the hardware conversion (the default before run 170)
                arms_run += [("per_tile_hw", None, "hw"), ("compact_hw", 16, "hw")]
            for name, ppr, scale_convert in arms_run + ([("per_tile_contig", None, "contig"),
                                                          ("compact_contig", 16, "contig")] if fmt == "nvfp4" else []):
                copy = {n: torch.zeros_like(t) for n, t in want.items()}
                copy["row"] = want.get("row")
                copy = {n: t for n, t in copy.items() if t is not None}
                # the contiguous load (block scales "soft"; the default since run 171); the other arms the strided loads
                contig = scale_convert == "contig"
                reencode_read_copy(state, copy, fmt, select, _programs_per_row=ppr, _nvfp4_contiguous_load=contig,
                                   _nvfp4_scale_convert=None if contig else scale_convert)
                arms[name] = copy
            torch.cuda.synchronize()
            for name, copy in arms.items():
                diffs = {n: int((bits(copy[n]) != bits(want[n])).sum()) for n in want if n != "row"}
                print(f"{shape} {fmt:5s} {name:11s} vs codec: {diffs}", flush=True)


if __name__ == "__main__":
    main()
