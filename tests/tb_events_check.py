#!/usr/bin/env python3
"""tb_events_check.py - checks a run directory's TensorBoard event file against its
metrics.jsonl, for tests/test_tb_events.sh.

    tb_events_check.py RUN_DIR            compare every scalar (TensorBoard's own reader)
    tb_events_check.py --crc EVENT_FILE   verify the TFRecord framing and both CRCs of
                                          every record with an independent CRC-32C

A tag's last '/' component is the metrics.jsonl key ("train/loss" is "loss"); values are
float32 in the event file and printed with a fixed number of decimals in metrics.jsonl, so
each is compared within both roundings. Exits 1 with a message on the first kind of
difference, 0 when everything agrees.
"""
import glob
import json
import os
import struct
import sys


def crc32c(data):
    """Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): no table, no library,
    so it shares nothing with the project's implementation."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def check_crcs(path):
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    data = open(path, "rb").read()
    off, n = 0, 0
    while off < len(data):
        if off + 12 > len(data):
            return f"{path}: truncated record header at byte {off}"
        (length,) = struct.unpack_from("<Q", data, off)
        (lcrc,) = struct.unpack_from("<I", data, off + 8)
        if masked(crc32c(data[off:off + 8])) != lcrc:
            return f"{path}: record {n} at byte {off}: length CRC mismatch"
        body = data[off + 12:off + 12 + length]
        if len(body) != length or off + 16 + length > len(data):
            return f"{path}: record {n} at byte {off}: truncated data"
        (dcrc,) = struct.unpack_from("<I", data, off + 12 + length)
        if masked(crc32c(body)) != dcrc:
            return f"{path}: record {n} at byte {off}: data CRC mismatch"
        off += 16 + length
        n += 1
    if n < 2:
        return f"{path}: {n} records; expected the file_version record and at least one step"
    print(f"{path}: {n} records, every length and data CRC correct")
    return None


# decimals each metrics.jsonl key is printed with (train.c, prof/run.c); None: %e, 7 digits
DECIMALS = {"loss": 6, "lr": None, "grad_norm": 6, "step_ms": 3, "tokens_per_s": 1, "achieved_gflops": 3,
            "host_rss_bytes": 0, "host_peak_bytes": 0, "host_plan_bytes": 0}


def compare(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    if len(files) != 1:
        return f"{run_dir}: {len(files)} event files; expected 1"
    metrics = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        o = json.loads(line)
        metrics[o["step"]] = o
    # size_guidance 0: keep every event (the default samples 1000 scalars per tag)
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    want = {"train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/step_ms"}
    if not want <= set(tags):
        return f"tags {sorted(tags)} lack {sorted(want - set(tags))}"
    if not any(t.startswith("memory/") for t in tags):
        return f"tags {sorted(tags)}: no memory scalars"
    compared = 0
    for tag in tags:
        # validation is logged only on the steps it ran, as val_loss in metrics.jsonl, and the
        # loss forecast on those of them where a fit was made
        key = "val_loss" if tag == "val/loss" else tag.rsplit("/", 1)[-1]
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        sparse = key in ("val_loss", "forecast_final", "forecast_band")
        logged = sorted(s for s in metrics if key in metrics[s]) if sparse else sorted(metrics)
        if not logged or steps != logged:
            return f"{tag}: steps {steps} differ from metrics.jsonl's {logged}"
        for e in events:
            ref = metrics[e.step].get(key)
            if ref is None:
                return f"{tag}: step {e.step}: metrics.jsonl has no key '{key}'"
            f32 = struct.unpack("<f", struct.pack("<f", ref))[0]  # the reference rounded to float32
            d = DECIMALS.get(key, 6)
            print_tol = abs(ref) * 5e-7 if d is None else 0.5 * 10 ** -d
            tol = print_tol + abs(ref) * 2.0 ** -23 + 1e-30
            if abs(e.value - ref) > tol:
                return (f"{tag}: step {e.step}: event file {e.value!r}, metrics.jsonl {ref!r} "
                        f"(float32 {f32!r}), differ by {abs(e.value - ref):.3g} > {tol:.3g}")
            compared += 1
    print(f"{run_dir}: {compared} scalars over {len(tags)} tags and {len(metrics)} steps agree with metrics.jsonl")
    return None


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--crc":
        msg = check_crcs(sys.argv[2])
    elif len(sys.argv) == 2:
        msg = compare(sys.argv[1])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if msg:
        print("FAIL:", msg)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
