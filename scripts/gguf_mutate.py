#!/usr/bin/env python3
"""Runs `infera check` and `infera run` on a GGUF file rewritten one change at a time.

    scripts/gguf_mutate.py [--infera build/infera] [--only TEXT] [--verbose] FILE.gguf [...]

Each change is one edit of the file's metadata or tensor headers, the tensor data left as
it is: every key dropped, set to other values (0, 1, small and huge counts, -1, another
type, NaN / inf for floats, other architecture and tokenizer names, malformed templates),
arrays emptied, cut short, lengthened, of other element types; keys added (merges, chat
templates, RoPE scaling, expert counts, split keys, alignment); tensors with their
dimensions swapped, grown, zeroed, given another ggml type, dropped, duplicated or renamed.
Each file is then checked and run (a 4-token greedy generation) with the address space
capped at 6 GB and a 60 s limit. A change may load (the value was informational) or be
refused; what it may not do is crash, hang, run out of memory or end without an error
line. Those are printed as BAD and make the exit status 1. --verbose prints every
outcome with the last line of stderr (the error message a user would read).

Not part of the test run (minutes per file); tests/unit/tools/gguf_arch_test.cpp keeps
the cases it found. Standard library only.
"""
import argparse
import copy
import os
import struct
import subprocess
import sys
import tempfile

SCALAR = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
STRING, ARRAY, U32, I32, F32, BOOL, U64 = 8, 9, 4, 5, 6, 7, 10


def read_gguf(path):
    """(version, [[key, type, value]], [[name, dims, type, offset]], data bytes, alignment)"""
    b = open(path, 'rb').read()
    pos = [4]

    def get(fmt):
        v = struct.unpack_from('<' + fmt, b, pos[0])[0]
        pos[0] += struct.calcsize('<' + fmt)
        return v

    def string():
        n = get('Q')
        s = b[pos[0]:pos[0] + n]
        pos[0] += n
        return s

    def value(t):
        if t in SCALAR:
            return get(SCALAR[t])
        if t == STRING:
            return string()
        if t == ARRAY:
            et, n = get('I'), get('Q')
            return (et, [value(et) for _ in range(n)])
        raise ValueError(f'{path}: metadata value type {t}')

    if b[:4] != b'GGUF':
        raise ValueError(f'{path}: not a GGUF file')
    version, n_tensors, n_kv = get('I'), get('Q'), get('Q')
    kvs = []
    for _ in range(n_kv):
        k = string()
        t = get('I')
        kvs.append([k, t, value(t)])
    tensors = []
    for _ in range(n_tensors):
        name = string()
        dims = [get('Q') for _ in range(get('I'))]
        tensors.append([name, dims, get('I'), get('Q')])
    align = next((v for k, t, v in kvs if k == b'general.alignment'), 32)
    start = (pos[0] + align - 1) // align * align
    return version, kvs, tensors, b[start:], align


def write_gguf(path, version, kvs, tensors, data, align):
    out = bytearray(b'GGUF') + struct.pack('<IQQ', version, len(tensors), len(kvs))

    def string(s):
        out.extend(struct.pack('<Q', len(s)) + s)

    def value(t, v):
        if t in SCALAR:
            out.extend(struct.pack('<' + SCALAR[t], v))
        elif t == STRING:
            string(v)
        elif t == ARRAY:
            et, items = v
            out.extend(struct.pack('<IQ', et, len(items)))
            for e in items:
                value(et, e)

    for k, t, v in kvs:
        string(k)
        out.extend(struct.pack('<I', t))
        value(t, v)
    for name, dims, t, offset in tensors:
        string(name)
        out.extend(struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims))
        out.extend(struct.pack('<IQ', t, offset))
    out.extend(b'\0' * ((-len(out)) % max(align, 1)))
    out.extend(data)
    with open(path, 'wb') as f:
        f.write(out)


def changes(kvs, tensors):
    """[(label, edit(kvs, tensors))]"""
    out = []

    def set_value(i, t, v):
        def edit(kv, _):
            kv[i][1], kv[i][2] = t, v
        return edit

    for i, (k, t, v) in enumerate(kvs):
        key = k.decode(errors='replace')

        def drop(kv, _, i=i):
            del kv[i]
        out.append((f'drop {key}', drop))
        if t in SCALAR and t not in (F32, 12, BOOL):  # integers
            for n in (0, 1, 3, 7, 1000000, 4294967295):
                out.append((f'{key} = {n}', set_value(i, U32, n)))
            out.append((f'{key} = -1 (i32)', set_value(i, I32, -1)))
            out.append((f'{key} = 2^62 (u64)', set_value(i, U64, 2**62)))
            out.append((f'{key} as a string', set_value(i, STRING, b'12')))
            out.append((f'{key} = NaN (f32)', set_value(i, F32, float('nan'))))
        elif t in (F32, 12):
            for x in (0.0, -1.0, float('nan'), float('inf'), 1e38, 1e-38):
                out.append((f'{key} = {x}', set_value(i, F32, x)))
            out.append((f'{key} = 5 (u32)', set_value(i, U32, 5)))
        elif t == BOOL:
            out.append((f'{key} flipped', set_value(i, BOOL, not v)))
            out.append((f'{key} = 7 (u32)', set_value(i, U32, 7)))
        elif t == STRING:
            for s in (b'', b'\xff\xfe\x00', b'llama', b'qwen3', b'qwen3moe', b'qwen35', b'qwen35moe', b'qwen3next',
                      b'deepseek2', b'deepseek32', b'gpt2', b'falcon', b'{{', b'{% for %}'):
                out.append((f'{key} = {s!r}', set_value(i, STRING, s)))
            out.append((f'{key} as an integer', set_value(i, U32, 1)))
        elif t == ARRAY:
            et, items = v
            out.append((f'{key} empty', set_value(i, ARRAY, (et, []))))
            out.append((f'{key} cut to 10', set_value(i, ARRAY, (et, items[:10]))))
            out.append((f'{key} 10 longer', set_value(i, ARRAY, (et, items + items[:10]))))
            out.append((f'{key} nested', set_value(i, ARRAY, (ARRAY, [(U32, [1, 2])]))))
            if et == STRING and items:
                out.append((f'{key} empty strings', set_value(i, ARRAY, (et, [b''] * len(items)))))
                out.append((f'{key} bad UTF-8', set_value(i, ARRAY, (et, [b'\xff' + x for x in items]))))
                out.append((f'{key} all one', set_value(i, ARRAY, (et, [items[len(items) // 2]] * len(items)))))
                out.append((f'{key} as integers', set_value(i, ARRAY, (I32, list(range(len(items)))))))
            elif et in (U32, I32, BOOL):
                out.append((f'{key} all 99', set_value(i, ARRAY, (U32, [99] * len(items)))))
                out.append((f'{key} all -1', set_value(i, ARRAY, (I32, [-1] * len(items)))))
            elif et == F32:
                out.append((f'{key} all NaN', set_value(i, ARRAY, (et, [float('nan')] * len(items)))))
                out.append((f'{key} as strings', set_value(i, ARRAY, (STRING, [b'x'] * len(items)))))

    arch = next((v for k, t, v in kvs if k == b'general.architecture' and t == STRING), b'llama')
    for k, t, v in [(b'tokenizer.ggml.merges', ARRAY, (STRING, [b'a b', b'x', b'', b'\xff \xff'])),
                    (b'tokenizer.chat_template', STRING, b'{% for m in messages %}{{ m.content }}{% endfor %}'),
                    (b'tokenizer.chat_template', STRING, b'{{ raise_exception("x") }}'),
                    (b'tokenizer.chat_template', STRING, b'{% for %}'),
                    (arch + b'.rope.scaling.type', STRING, b'yarn'), (arch + b'.rope.scaling.type', STRING, b'linear'),
                    (arch + b'.rope.scaling.factor', F32, 0.0), (arch + b'.expert_count', U32, 8),
                    (arch + b'.expert_used_count', U32, 9), (arch + b'.attention.sliding_window', U32, 0),
                    (arch + b'.rope.dimension_sections', ARRAY, (I32, [1, 2, 3, 4])),
                    (b'tokenizer.ggml.eot_token_id', U32, 99999), (b'tokenizer.ggml.padding_token_id', U32, 2**32 - 1),
                    (b'tokenizer.ggml.added_tokens', ARRAY, (STRING, [b'<x>'])), (b'split.count', 2, 3),
                    (b'split.no', 2, 5), (b'general.alignment', U32, 0), (b'general.alignment', U32, 3)]:
        def add(kv, _, k=k, t=t, v=v):
            kv.append([k, t, v])
        out.append((f'add {k.decode()} = {str(v)[:30]}', add))

    picked = sorted({0, 1, 2, len(tensors) // 2, len(tensors) - 1} & set(range(len(tensors))))
    for j in picked:
        name = tensors[j][0].decode(errors='replace')

        def tensor_edit(fn, j=j):
            def edit(_, ts):
                fn(ts[j])
            return edit

        out.append((f'{name} dims reversed', tensor_edit(lambda t: t.__setitem__(1, t[1][::-1]))))
        out.append((f'{name} dims + 1', tensor_edit(lambda t: t.__setitem__(1, [d + 1 for d in t[1]]))))
        out.append((f'{name} dims all 1', tensor_edit(lambda t: t.__setitem__(1, [1] * len(t[1])))))
        out.append((f'{name} one more dim', tensor_edit(lambda t: t.__setitem__(1, t[1] + [1]))))
        out.append((f'{name} first dim 0', tensor_edit(lambda t: t.__setitem__(1, [0] + t[1][1:]))))
        out.append((f'{name} first dim 2^40', tensor_edit(lambda t: t.__setitem__(1, [2**40] + t[1][1:]))))
        for ggml_type in (0, 1, 2, 8, 12, 14, 23, 30, 99):
            out.append((f'{name} ggml type {ggml_type}', tensor_edit(lambda t, g=ggml_type: t.__setitem__(2, g))))
        out.append((f'{name} offset past the end', tensor_edit(lambda t: t.__setitem__(3, 2**40))))

        def drop_tensor(_, ts, j=j):
            del ts[j]

        def dup_tensor(_, ts, j=j):
            ts.append(list(ts[j]))

        def rename_tensor(_, ts, j=j):
            ts[j][0] = b'blk.99.attn_q.weight'
        out.append((f'drop tensor {name}', drop_tensor))
        out.append((f'duplicate tensor {name}', dup_tensor))
        out.append((f'rename tensor {name}', rename_tensor))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('files', nargs='+')
    ap.add_argument('--infera', default=os.path.join(os.path.dirname(__file__), '..', 'build', 'infera'))
    ap.add_argument('--only', help='run the changes whose label contains this text')
    ap.add_argument('--timeout', type=int, default=60)
    ap.add_argument('--verbose', action='store_true')
    args = ap.parse_args()
    bad = total = 0
    with tempfile.TemporaryDirectory(prefix='gguf_mutate_') as tmp:
        for src in args.files:
            version, kvs, tensors, data, align = read_gguf(src)
            for label, edit in changes(kvs, tensors):
                if args.only and args.only not in label:
                    continue
                kv, ts = copy.deepcopy(kvs), copy.deepcopy(tensors)
                edit(kv, ts)
                path = os.path.join(tmp, os.path.basename(src))
                try:
                    write_gguf(path, version, kv, ts, data, align)
                except (struct.error, OverflowError) as e:
                    print(f'skipped {label}: {e}')
                    continue
                for cmd in (['check', path],
                            ['run', '-m', path, '--prompt', 'Once upon a time', '-n', '4', '--temp', '0',
                             '--ignore-eos']):
                    total += 1
                    try:
                        r = subprocess.run(['bash', '-c', 'ulimit -v 6000000; exec "$@"', '_', args.infera] + cmd,
                                           capture_output=True, timeout=args.timeout, text=True, errors='replace')
                        lines = (r.stderr + r.stdout).strip().splitlines()
                        # (check prints its findings, the first error among them, to stdout)
                        errors = [x for x in lines if x.startswith('error')]
                        rc, last = r.returncode, (errors or lines or [''])[0 if errors else -1]
                    except subprocess.TimeoutExpired:
                        rc, last = 'timeout', ''
                    failed = (rc == 'timeout' or rc < 0 or rc >= 124 or 'terminate called' in last or
                              'bad_alloc' in last or 'Sanitizer' in last or (rc != 0 and not last))
                    bad += failed
                    if failed or args.verbose:
                        print(f'{"BAD" if failed else "ok "} {os.path.basename(src)} {cmd[0]:5} {label} | exit {rc} '
                              f'| {last[:200]}')
    print(f'{total} runs, {bad} bad')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
