"""Classic BPF seccomp programs as data: route more calls to the supervisor without
changing what the policy's own program decides, and replay that program on one call.

Custom syscall handlers (sandlock.handler) must see the calls they name, but only after
the policy's own rules had their say ("built-in handlers run first"): a call the program
refuses (ERRNO, KILL) stays refused and never reaches a handler. `route_to_supervisor`
does that on the compiled program itself: every `RET ALLOW` becomes a jump to an epilogue
that returns USER_NOTIF for the handled syscall numbers and ALLOW otherwise. Calls the
program already sends to the supervisor keep going there. libseccomp is not asked to
merge rules of different actions on one syscall (its merge is order-dependent).

`evaluate` runs a program on one call's seccomp_data, so that the supervisor can tell a
call the policy itself sends to it (its built-in handler runs after the user's) from one
sent only for a handler (the kernel performs it). It implements the instructions
libseccomp emits; any other instruction raises, and the caller fails closed.
"""

from __future__ import annotations

import struct

RET_KILL_PROCESS = 0x80000000
RET_ALLOW = 0x7FFF0000
RET_USER_NOTIF = 0x7FC00000
RET_ACTION_FULL = 0xFFFF0000

# BPF opcodes (linux/bpf_common.h)
_LD, _LDX, _ST, _STX, _ALU, _JMP, _RET, _MISC = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07
_W, _ABS, _IMM, _MEM = 0x00, 0x20, 0x00, 0x60
_JA, _JEQ, _JGT, _JGE, _JSET = 0x00, 0x10, 0x20, 0x30, 0x40
_K, _X, _A = 0x00, 0x08, 0x10
_ADD, _SUB, _AND, _OR, _LSH, _RSH, _NEG, _XOR = 0x00, 0x10, 0x50, 0x40, 0x60, 0x70, 0x80, 0xA0
_TAX, _TXA = 0x00, 0x80
_INSN = struct.Struct("=HBBI")   # struct sock_filter: code, jt, jf, k
MAX_INSNS = 4096                 # BPF_MAXINSNS
NR_OFFSET = 0                    # struct seccomp_data: nr, arch, ip, args[6]


class BpfError(ValueError):
    pass


def _decode(program: bytes) -> list[tuple[int, int, int, int]]:
    if len(program) % _INSN.size:
        raise BpfError("a BPF program is a whole number of instructions")
    return [_INSN.unpack_from(program, i) for i in range(0, len(program), _INSN.size)]


def route_to_supervisor(program: bytes, numbers) -> bytes:
    """`program` with every call it allows whose syscall number is in `numbers` returned
    USER_NOTIF instead. Nothing else changes."""
    numbers = sorted(set(numbers))
    insns = _decode(program)
    if not numbers:
        return program
    end = len(insns)
    out = []
    for i, (code, jt, jf, k) in enumerate(insns):
        if code == _RET | _K and k == RET_ALLOW:
            # JA is relative to the next instruction; the epilogue starts at `end`.
            out.append((_JMP | _JA, 0, 0, end - i - 1))
        else:
            out.append((code, jt, jf, k))
    # Epilogue: A = nr; one JEQ per number to the final RET USER_NOTIF.
    out.append((_LD | _W | _ABS, 0, 0, NR_OFFSET))
    n = len(numbers)
    for j, nr in enumerate(numbers):
        to_notify = n - j  # over the remaining JEQs and the RET ALLOW
        if to_notify > 255:
            raise BpfError("too many handled syscalls for one epilogue")
        out.append((_JMP | _JEQ | _K, to_notify, 0, nr))
    out.append((_RET | _K, 0, 0, RET_ALLOW))
    out.append((_RET | _K, 0, 0, RET_USER_NOTIF))
    if len(out) > MAX_INSNS:
        raise BpfError("the program with handlers is longer than the kernel accepts")
    return b"".join(_INSN.pack(*insn) for insn in out)


def seccomp_data(nr: int, arch: int, ip: int, args) -> bytes:
    return struct.pack("=iIQ6Q", nr, arch, ip, *args)


def decode(program: bytes) -> list:
    """The program as instructions: decode once, evaluate() many times."""
    return _decode(program)


def evaluate(program, data: bytes) -> int:
    """The action `program` (bytes, or decode()'s list) returns for `data` (struct
    seccomp_data)."""
    insns = _decode(program) if isinstance(program, (bytes, bytearray)) else program
    a = x = 0
    mem = [0] * 16
    pc = 0
    for _ in range(len(insns) + 1):  # forward jumps only: bounded by the length
        if pc >= len(insns):
            raise BpfError("ran past the end of the program")
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if cls == _RET:
            return (a if code & 0x18 == _A else k) & 0xFFFFFFFF
        if cls == _LD:
            mode = code & 0xE0
            if mode == _ABS and code & 0x18 == _W:
                if k + 4 > len(data) or k % 4:
                    raise BpfError(f"load outside seccomp_data at {k}")
                a = struct.unpack_from("=I", data, k)[0]
            elif mode == _IMM:
                a = k
            elif mode == _MEM:
                a = mem[k]
            else:
                raise BpfError(f"unsupported load {code:#x}")
        elif cls == _LDX:
            mode = code & 0xE0
            if mode == _IMM:
                x = k
            elif mode == _MEM:
                x = mem[k]
            else:
                raise BpfError(f"unsupported load into X {code:#x}")
        elif cls == _ST:
            mem[k] = a
        elif cls == _STX:
            mem[k] = x
        elif cls == _ALU:
            op, src = code & 0xF0, (x if code & 0x08 else k)
            if op == _AND:
                a &= src
            elif op == _OR:
                a |= src
            elif op == _XOR:
                a ^= src
            elif op == _ADD:
                a += src
            elif op == _SUB:
                a -= src
            elif op == _LSH:
                a <<= src
            elif op == _RSH:
                a >>= src
            elif op == _NEG:
                a = -a
            else:
                raise BpfError(f"unsupported ALU operation {code:#x}")
            a &= 0xFFFFFFFF
        elif cls == _JMP:
            op, src = code & 0xF0, (x if code & 0x08 else k)
            if op == _JA:
                pc += k
                continue
            if op == _JEQ:
                taken = a == src
            elif op == _JGT:
                taken = a > src
            elif op == _JGE:
                taken = a >= src
            elif op == _JSET:
                taken = bool(a & src)
            else:
                raise BpfError(f"unsupported jump {code:#x}")
            pc += jt if taken else jf
        elif cls == _MISC:
            if code & 0xF8 == _TAX:
                x = a
            elif code & 0xF8 == _TXA:
                a = x
            else:
                raise BpfError(f"unsupported instruction {code:#x}")
    raise BpfError("the program did not return")
