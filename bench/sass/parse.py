"""SASS text (cuobjdump -sass) -> per-function instruction lists, their loops, and the counts of a hot loop.

A loop is a backward branch (target address <= the branch's own); its body is every instruction from the target
to the branch, rare paths inside it included (an upper bound on what one iteration issues). The hot loop is the
innermost loop (no other loop's back-edge inside it) with the most work: tensor-core instructions first, then
FLOPs, then length.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRA = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\S+)?\s+(?:!?U?P\w+\s*,\s*)?(0x[0-9a-f]+)")   # guard as @P or operand

# the mnemonic families counted (the part before the first dot)
FP = frozenset({"FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSET", "FSEL", "FCHK", "MUFU", "FRND", "HADD2", "HMUL2",
                "HFMA2", "HMNMX2", "HSETP2", "DADD", "DMUL", "DFMA"})
TENSOR = frozenset({"HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "QMMA", "OMMA", "DMMA", "BMMA"})
SHARED_LOADS = frozenset({"LDS", "LDSM"})
GLOBAL_LOADS = frozenset({"LDG", "LD", "LDGSTS", "UTMALDG", "UBLKCP"})
# one warp instruction's FLOPs (32 threads; fmad=false leaves few FFMA); tensor shapes from the mnemonic
FLOPS_PER_WARP = {"FADD": 32, "FMUL": 32, "FFMA": 64, "HADD2": 64, "HMUL2": 64, "HFMA2": 128}


@dataclass(frozen=True)
class Instr:
    addr: int
    text: str          # the instruction without its address or encoding, e.g. "@P0 FADD R1, R2, R3"

    @property
    def predicated(self) -> bool:
        return self.text.startswith("@")

    @property
    def op(self) -> str:
        """The full opcode with modifiers, e.g. HMMA.16816.F32.BF16."""
        body = self.text.split(None, 1)[1] if self.predicated else self.text
        return body.split(None, 1)[0] if body else ""

    @property
    def family(self) -> str:
        return self.op.split(".", 1)[0]


@dataclass(frozen=True)
class Loop:
    start: int         # index of the first instruction of the body (the back-edge's target)
    end: int           # index of the back-edge branch (inclusive)

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and self != other


@dataclass(frozen=True)
class Counts:
    """What one iteration of a loop issues (warp instructions)."""
    instr: int
    predicated: int
    fp: int
    flops: int          # FLOPs of the iteration's FP and tensor instructions, per warp
    tensor: int
    shared_loads: int
    global_loads: int
    fmul: int
    fadd: int


def functions(sass: str) -> dict[str, list[Instr]]:
    """Each function's instructions in address order."""
    out: dict[str, list[Instr]] = {}
    cur = None
    for line in sass.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = _INSTR.match(line)
        if m and cur is not None:
            cur.append(Instr(int(m.group(1), 16), m.group(2).strip()))
    return out


def loops(code: list[Instr]) -> list[Loop]:
    """Every backward branch's loop (a branch to itself, the end-of-kernel trap, is none)."""
    index = {ins.addr: i for i, ins in enumerate(code)}
    out = []
    for i, ins in enumerate(code):
        if ins.family != "BRA":
            continue
        m = _BRA.match(ins.text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < ins.addr and target in index:
            out.append(Loop(index[target], i))
    return out


def tensor_flops(op: str) -> int:
    """FLOPs of one warp's tensor instruction from its shape: HMMA.16816 = 2 * 16 * 8 * 16; a warpgroup's
    HGMMA.64xNx16 counts a quarter per warp (each of the group's four warps issues it)."""
    fam, _, rest = op.partition(".")
    shape = rest.split(".")[0]
    if fam.endswith("GMMA"):
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", shape)
        return 2 * int(m.group(1)) * int(m.group(2)) * int(m.group(3)) // 4 if m else 0
    mnk = {"1688": (16, 8, 8), "16816": (16, 8, 16), "16832": (16, 8, 32), "884": (8, 8, 4)}.get(shape)
    return 2 * mnk[0] * mnk[1] * mnk[2] if mnk else 0


def count(code: list[Instr], loop: Loop) -> Counts:
    body = code[loop.start:loop.end + 1]
    fam = [i.family for i in body]
    flops = sum(FLOPS_PER_WARP.get(f, 0) for f in fam) + sum(tensor_flops(i.op) for i in body if i.family in TENSOR)
    return Counts(instr=len(body), predicated=sum(i.predicated for i in body), fp=sum(f in FP for f in fam),
                  flops=flops, tensor=sum(f in TENSOR for f in fam),
                  shared_loads=sum(f in SHARED_LOADS for f in fam), global_loads=sum(f in GLOBAL_LOADS for f in fam),
                  fmul=fam.count("FMUL"), fadd=fam.count("FADD"))


def hot_loop(code: list[Instr], keep=None) -> tuple[Loop, Counts] | None:
    """The innermost loop with the most work (tensor instructions, then FLOPs, then length), among those whose
    counts `keep` accepts (all without it); None without such loops."""
    all_loops = loops(code)
    inner = [lp for lp in all_loops if not any(lp.contains(o) for o in all_loops)]
    scored = [(lp, count(code, lp)) for lp in inner]
    scored = [s for s in scored if keep is None or keep(s[1])]
    if not scored:
        return None
    return max(scored, key=lambda s: (s[1].tensor, s[1].flops, s[1].instr))
