#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.

"""Benchmarks of the dm-clone data path and of the driver's own code paths.

Every figure is measured side by side in one run and reported as a ratio
to a baseline of the same run (the guest is emulated: absolute speeds mean
nothing).  The results go to ``<artifacts>/bench/results.json`` as they
come; ``tests/bench/report.py`` turns them into the Markdown table and the
plot kept in doc/source/benchmarks/.  The assertions only check that a
measurement worked, never how fast it was.

The source of every clone is one LV on node A, filled with data and read
by node B over LIO iSCSI (veth inside the guest), as in a real move.

Stays on the one-kernel layout for now (marked so): the path it measures
and publishes (a veth pair inside one kernel, ``bench.Netem`` on vethA
and vethB, VGs in guest RAM; conftest.py's ``source`` exported from this
process) exists only there; separate kernels would measure another one.
"""

import mmap
import os
import subprocess
import time

import pytest

from cinder_dmclone import dmsetup as dms
from cinder_dmclone import hydration
from cinder_dmclone import layout
from cinder_dmclone import opts
from cinder_dmclone import privileged
from tests.bench import bench
from tests.harness import testbed

pytestmark = pytest.mark.layouts('one-kernel')

KiB = bench.KiB
MiB = bench.MiB


def project_defaults():
    d = {o.name: o.default for o in opts.dmclone_opts}
    return {'region_bytes': d['dmclone_region_size'] * KiB,
            'threshold': d['dmclone_hydration_threshold'],
            'batch': d['dmclone_hydration_batch_size']}


def point_name(region_bytes, threshold, batch):
    return 'r%dk-t%d-b%d' % (region_bytes // KiB, threshold, batch)


# --------------------------------------------------------------------------
# 1. Write cost of a volume in transfer
# --------------------------------------------------------------------------

def test_write_cost(results, dm, topo, lvs, source, size, scale):
    """4k random writes: plain LV, handle (linear), clones in transfer.

    Clones are fresh (nothing hydrated, hydration off, as while a live
    migration is in progress or right after a move), one per fio run,
    with the metadata LV on the data VG (dmc-b) or on the metadata VG
    (dmc-b-meta, its own loop device), at the project's region size and
    at 4 KiB regions (where a 4 KiB write covers a whole region and needs
    no copy from the source).
    """
    _src_lv, disk = source
    defaults = project_defaults()
    runtime = 10 if scale == 'full' else 4
    reps = 2 if scale == 'full' else 1
    jobs = {'qd1_sync': dict(rw='randwrite', iodepth=1, sync=True),
            'qd16': dict(rw='randwrite', iodepth=16)}
    plain = lvs.make(topo.b.vg, size)
    under_handle = lvs.make(topo.b.vg, size)
    dm.create('bench-handle', [dms.linear_segment(0, size // bench.SECTOR,
                                                  under_handle)],
              'BENCH-bench-handle')
    kinds = [('plain_lv', None), ('handle_linear', None),
             ('clone_meta_same_vg', (topo.b.vg, defaults['region_bytes'])),
             ('clone_meta_separate_vg',
              (topo.b.meta_vg, defaults['region_bytes'])),
             ('clone_meta_separate_vg_4k', (topo.b.meta_vg, 4 * KiB))]
    runs = {}
    try:
        for rep in range(reps):
            for job, spec in jobs.items():
                for kind, clone_spec in kinds:
                    clone = None
                    if kind == 'plain_lv':
                        path = plain
                    elif kind == 'handle_linear':
                        path = dms.device_path('bench-handle')
                    else:
                        meta_vg, region = clone_spec
                        clone = bench.Clone(dm, lvs, disk, size, region,
                                            topo.b.vg, meta_vg)
                        path = clone.path
                    try:
                        figures = bench.fio(path, runtime=runtime, **spec)
                        entry = {'iops': bench.total_iops(figures),
                                 'figures': figures}
                        if clone is not None:
                            st = clone.status()
                            entry['region_bytes'] = clone.region_bytes
                            entry['hydrated_fraction_after'] = st.progress
                    finally:
                        if clone is not None:
                            clone.remove()
                    runs.setdefault(job, {}).setdefault(kind, []).append(
                        entry)
                    testbed.LOG.info('write cost %s %s rep %d: %.0f IOPS',
                                     job, kind, rep, entry['iops'])
    finally:
        dm.remove('bench-handle')
    summary = {}
    for job, by_kind in runs.items():
        base = bench.median([e['iops'] for e in by_kind['plain_lv']])
        summary[job] = {kind: {
            'iops_median': bench.median([e['iops'] for e in entries]),
            'ratio_to_plain': bench.median([e['iops'] for e in entries])
            / base,
            'clat_mean_us': bench.median(
                [e['figures']['write']['clat_mean_us'] for e in entries]),
            'hydrated_fraction_after': bench.median(
                [e.get('hydrated_fraction_after', 0) for e in entries]),
        } for kind, entries in by_kind.items()}
    results.put('write_cost', {
        'runtime_s': runtime, 'repetitions': reps, 'size_bytes': size,
        'jobs': {k: v for k, v in jobs.items()},
        'summary': summary, 'runs': runs})
    assert all(s['plain_lv']['iops_median'] > 0 for s in summary.values())


# --------------------------------------------------------------------------
# 2. Reads of unhydrated regions
# --------------------------------------------------------------------------

def test_unhydrated_reads(results, dm, topo, lvs, source, size, scale):
    """Reads of unhydrated regions vs plain reads of the same iSCSI disk.

    The clone has nothing hydrated and hydration off; a local LV gives
    the scale of a local read.
    """
    _src_lv, disk = source
    defaults = project_defaults()
    runtime = 10 if scale == 'full' else 4
    local = lvs.make(topo.b.vg, size)
    bench.fill(local, size)
    clone = bench.Clone(dm, lvs, disk, size, defaults['region_bytes'],
                        topo.b.vg, topo.b.meta_vg)
    jobs = {'randread_4k_qd1': dict(rw='randread', bs='4k', iodepth=1),
            'randread_4k_qd16': dict(rw='randread', bs='4k', iodepth=16),
            'seqread_1m_qd1': dict(rw='read', bs='1M', iodepth=1)}
    summary = {}
    try:
        for job, spec in jobs.items():
            row = {}
            for kind, path in (('iscsi_disk', disk), ('clone', clone.path),
                               ('local_lv', local)):
                figures = bench.fio(path, runtime=runtime, size=size,
                                    **spec)
                row[kind] = {'iops': bench.total_iops(figures),
                             'bw_bytes': figures['read']['bw_bytes'],
                             'clat_mean_us': figures['read']['clat_mean_us']}
            row['clone_to_iscsi'] = row['clone']['iops'] / \
                row['iscsi_disk']['iops']
            row['iscsi_to_local'] = row['iscsi_disk']['iops'] / \
                row['local_lv']['iops']
            summary[job] = row
            testbed.LOG.info('unhydrated reads %s: %s', job, row)
        st = clone.status()
        assert st.hydrated_regions == 0, 'reads must not hydrate'
    finally:
        clone.remove()
    results.put('unhydrated_reads', {'runtime_s': runtime,
                                     'size_bytes': size,
                                     'summary': summary})


# --------------------------------------------------------------------------
# 3. Hydration throughput vs the raw copy
# --------------------------------------------------------------------------

def hydration_points(scale, defaults):
    """(region bytes, threshold, batch) points of the sweep.

    * the kernel defaults (threshold 1, batch 1) at 4 KiB, 64 KiB, 1 MiB;
    * batch sweep at 64 KiB regions, threshold 64: batch 1, 4, 16, 64;
    * threshold sweep at 64 KiB, batch 16: threshold 16, 256;
    * region sweep at a constant 1 MiB per batch and 4 MiB in flight:
      4 KiB (b256, t1024), 16 KiB (b64, t256), 256 KiB (b4, t16),
      1 MiB (b1, t4);
    * the project's defaults (whatever cinder_dmclone/opts.py says).
    """
    if scale == 'quick':
        points = [(64 * KiB, 1, 1), (64 * KiB, 64, 16), (1024 * KiB, 4, 1)]
    else:
        points = [(4 * KiB, 1, 1), (64 * KiB, 1, 1), (1024 * KiB, 1, 1),
                  (64 * KiB, 64, 1), (64 * KiB, 64, 4), (64 * KiB, 64, 16),
                  (64 * KiB, 64, 64), (64 * KiB, 16, 16),
                  (64 * KiB, 256, 16),
                  (4 * KiB, 1024, 256), (16 * KiB, 256, 64),
                  (256 * KiB, 16, 4), (1024 * KiB, 4, 1)]
    mine = (defaults['region_bytes'], defaults['threshold'],
            defaults['batch'])
    kernel = (defaults['region_bytes'], 1, 1)
    for p in (kernel, mine):
        if p not in points:
            points.append(p)
    return points


def raw_copy(dm, disk, dest, size, sample_s=1.0):
    """dd 1 MiB direct from the iSCSI disk to a local LV, timed.

    Samples ``dmsetup status`` every ``sample_s`` like a hydration run
    does, so both pay the same sampling overhead.
    """
    count = size // MiB
    t0 = time.monotonic()
    proc = subprocess.Popen(['dd', 'if=%s' % disk, 'of=%s' % dest, 'bs=1M',
                             'count=%d' % count, 'iflag=direct',
                             'oflag=direct'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    while True:
        try:
            proc.wait(timeout=sample_s)
            break
        except subprocess.TimeoutExpired:
            dm.clone_statuses()
    seconds = time.monotonic() - t0
    _out, err = proc.communicate()
    assert proc.returncode == 0, err
    return {'seconds': round(seconds, 3), 'bytes_per_s': size / seconds}


NETEM_DELAY_US = 500


def netem_points(scale, defaults):
    """The subset measured again with 2 x 500 us of added network delay."""
    if scale == 'quick':
        return [(64 * KiB, 1, 1), (64 * KiB, 64, 16)]
    points = [(64 * KiB, 1, 1), (64 * KiB, 64, 1), (64 * KiB, 64, 4),
              (64 * KiB, 64, 16), (64 * KiB, 256, 16), (64 * KiB, 64, 64),
              (1024 * KiB, 4, 1), (1024 * KiB, 1, 1)]
    mine = (defaults['region_bytes'], defaults['threshold'],
            defaults['batch'])
    if mine not in points:
        points.append(mine)
    return points


def sweep(dm, topo, lvs, disk, size, points, cap, record):
    """Raw copy, every point, raw copy again; ``record`` after each."""
    raws, out = [], {}

    def measure_raw():
        dest = lvs.make(topo.b.vg, size)
        try:
            raws.append(raw_copy(dm, disk, dest, size))
        finally:
            lvs.remove(dest)
        testbed.LOG.info('raw copy: %s', raws[-1])

    measure_raw()
    for region, threshold, batch in points:
        name = point_name(region, threshold, batch)
        clone = bench.Clone(dm, lvs, disk, size, region, topo.b.vg,
                            topo.b.meta_vg, threshold=threshold, batch=batch)
        try:
            r = clone.hydrate(cap_s=cap)
        finally:
            clone.remove()
        r.update(region_bytes=region, threshold=threshold, batch=batch)
        out[name] = r
        testbed.LOG.info('hydration %s: %.1f s complete=%s', name,
                         r['seconds'], r['complete'])
        record(out, raws)
    measure_raw()
    raw_bps = bench.median([r['bytes_per_s'] for r in raws])
    for r in out.values():
        r['ratio_to_raw'] = r['bytes_per_s'] / raw_bps
    return out, raws, raw_bps


def test_hydration(results, dm, topo, lvs, source, source_size, scale):
    """Hydration of the whole source vs dd of it, same path, same run.

    First over the testbed's veth (almost no latency), then a subset
    with netem adding 500 us each way (1 ms more round trip), which is
    where batching and parallel copies should matter.
    """
    _src_lv, disk = source
    size = source_size
    defaults = project_defaults()
    cap = 120 if scale == 'full' else 40
    section = {'size_bytes': size, 'cap_s': cap,
               'project_default': point_name(defaults['region_bytes'],
                                             defaults['threshold'],
                                             defaults['batch']),
               'kernel_default': point_name(defaults['region_bytes'], 1, 1)}

    def record(key):
        def put(out, raws):
            section[key] = {'points': out, 'raw_copies': raws}
            results.put('hydration', section)
        return put

    out, raws, raw_bps = sweep(dm, topo, lvs, disk, size,
                               hydration_points(scale, defaults), cap,
                               record('veth'))
    section['veth'] = {'points': out, 'raw_copies': raws,
                       'raw_bytes_per_s_median': raw_bps}
    results.put('hydration', section)
    assert all(r['hydrated_bytes'] > 0 for r in out.values())

    with bench.Netem(NETEM_DELAY_US):
        lat = {}
        for kind in ('qd1_4k_randread', ):
            lat[kind] = bench.fio(disk, 'randread', runtime=5, size=size)
        out, raws, raw_bps = sweep(dm, topo, lvs, disk, size,
                                   netem_points(scale, defaults), cap,
                                   record('netem'))
    section['netem'] = {'points': out, 'raw_copies': raws,
                        'raw_bytes_per_s_median': raw_bps,
                        'delay_us_each_way': NETEM_DELAY_US,
                        'iscsi_4k_read_clat_mean_us':
                            lat['qd1_4k_randread']['read']['clat_mean_us']}
    results.put('hydration', section)


def test_hydration_under_load(results, dm, topo, lvs, source, source_size,
                              scale):
    """A tenant (4k random 50/50 read/write, QD1) during hydration.

    For the project's defaults and the kernel's: hydration time alone vs
    with the tenant, and the tenant's IOPS on a clone with hydration off
    vs while hydration runs (same window length).
    """
    _src_lv, disk = source
    size = source_size
    defaults = project_defaults()
    settings = [('project_default', defaults['threshold'], defaults['batch']),
                ('kernel_default', 1, 1)]
    region = defaults['region_bytes']
    cap = 150 if scale == 'full' else 40

    def tenant_job(path, runtime):
        return bench.fio_args(path, 'randrw', bs='4k', iodepth=1,
                              runtime=runtime, name='tenant', rwmixread=50)

    out = {}
    for label, threshold, batch in settings:
        # hydration alone
        clone = bench.Clone(dm, lvs, disk, size, region, topo.b.vg,
                            topo.b.meta_vg, threshold=threshold, batch=batch)
        try:
            alone = clone.hydrate(cap_s=cap)
        finally:
            clone.remove()
        window = max(5, min(int(alone['seconds']) + 1, 60))

        # the tenant on a clone that does not hydrate
        clone = bench.Clone(dm, lvs, disk, size, region, topo.b.vg,
                            topo.b.meta_vg, threshold=threshold, batch=batch)
        try:
            run = bench.FioBackground([tenant_job(clone.path, window + 1)],
                                      log='iops')
            run.wait(timeout=window + 300)
            rows = run.entries(1)
            run.cleanup()
            tenant_alone = bench.iops_in_window(rows, 1000, 1000 + window *
                                                1000)
        finally:
            clone.remove()

        # both at once: hydration starts 1 s into the tenant's run
        clone = bench.Clone(dm, lvs, disk, size, region, topo.b.vg,
                            topo.b.meta_vg, threshold=threshold, batch=batch)
        try:
            run = bench.FioBackground(
                [tenant_job(clone.path, 1 + 4 * window + 30)], log='iops')
            time.sleep(1.0)
            start_ms = (time.monotonic() - run.t0) * 1000
            loaded = clone.hydrate(cap_s=cap)
            run.stop()
            run.wait(timeout=300)
            rows = run.entries(1)
            run.cleanup()
            end_ms = start_ms + loaded['seconds'] * 1000
            tenant_during = bench.iops_in_window(rows, start_ms, end_ms)
        finally:
            clone.remove()
        out[label] = {
            'region_bytes': region, 'threshold': threshold, 'batch': batch,
            'hydration_alone_s': alone['seconds'],
            'hydration_with_tenant_s': loaded['seconds'],
            'hydration_complete_with_tenant': loaded['complete'],
            'hydration_slowdown': loaded['seconds'] / alone['seconds'],
            'tenant_window_s': window,
            'tenant_iops_no_hydration': tenant_alone,
            'tenant_iops_during_hydration': tenant_during,
            'tenant_ratio': (tenant_during / tenant_alone
                             if tenant_alone and tenant_during else None),
            'samples_with_tenant': loaded['samples'],
        }
        testbed.LOG.info('under load %s: %s', label, {
            k: v for k, v in out[label].items() if k != 'samples_with_tenant'})
        results.put('hydration_under_load', out)
    assert all(v['tenant_iops_no_hydration'] for v in out.values())


# --------------------------------------------------------------------------
# 4. The I/O pause of the swap to linear
# --------------------------------------------------------------------------

def test_swap_pause(results, dm, topo, lvs, source, scale):
    """The I/O pause of the swap of a hydrated clone to linear.

    Longest completion gap of a QD1 reader and a QD1 sync writer while
    a fully hydrated clone is replaced by a linear table: with the
    project's DMSetup.reload (what swap_to_linear calls), with the three
    commands load, suspend, resume, and with load then resume alone (the
    kernel suspends, swaps and resumes inside the one resume ioctl).

    The same clone is swapped back and forth: the metadata says every
    region is hydrated, so reloading the clone table is cheap and each
    cycle measures one clone -> linear swap in its own fio run.  A run
    without a swap gives the background jitter.
    """
    _src_lv, disk = source
    defaults = project_defaults()
    size = 64 * MiB
    cycles = 5 if scale == 'full' else 2
    region = defaults['region_bytes']
    sectors = size // bench.SECTOR
    clone = bench.Clone(dm, lvs, disk, size, region, topo.b.vg,
                        topo.b.meta_vg, threshold=defaults['threshold'],
                        batch=defaults['batch'])
    clone_table = dm.table(clone.name)
    linear = [dms.linear_segment(0, sectors, clone.dest)]

    def jobs(runtime):
        return [bench.fio_args(clone.path, 'randread', runtime=runtime,
                               name='reader'),
                bench.fio_args(clone.path, 'randwrite', runtime=runtime,
                               sync=True, name='writer')]

    def explicit_suspend(name, segments):
        dm.load(name, segments)
        dm.suspend(name)
        dm.resume(name)

    def resume_only(name, segments):
        # resume with an inactive table suspends, swaps and resumes in
        # one ioctl (dm-ioctl do_resume): no process start in the pause
        dm.load(name, segments)
        dm.resume(name)

    variants = [('driver_reload', dm.reload),
                ('load_suspend_resume', explicit_suspend),
                ('load_resume', resume_only)]

    def one(swap_fn):
        run = bench.FioBackground(jobs(5), log='lat')
        time.sleep(2.5)
        took = None
        if swap_fn is not None:
            took, _ = bench.timed(swap_fn, clone.name, linear)
        run.wait(timeout=300)
        figures = {'reader': bench.completion_gaps(run.entries(1)),
                   'writer': bench.completion_gaps(run.entries(2))}
        run.cleanup()
        return took, figures

    out = {'variants': {}}
    try:
        r = clone.hydrate(cap_s=300)
        assert r['complete'], 'the clone must hydrate before the swap'
        _, out['control'] = one(None)
        for _ in range(cycles):
            for variant, fn in variants:
                if dm.table(clone.name)[0].target != 'clone':
                    dm.reload(clone.name, [dms.Segment(
                        s.start, s.length, s.target, s.args)
                        for s in clone_table])
                    assert clone.status().fully_hydrated
                took, figures = one(fn)
                assert dm.table(clone.name)[0].target == 'linear'
                out['variants'].setdefault(variant, []).append(
                    {'reload_s': took, 'io': figures})
                testbed.LOG.info('swap %s: %.3f s, %s', variant, took,
                                 figures)
    finally:
        clone.remove()
    for variant, cycles_out in out['variants'].items():
        out[variant] = {
            'max_gap_ms': max(c['io'][j]['max_gap_ms']
                              for c in cycles_out for j in c['io']),
            'median_of_max_gap_ms': bench.median(
                [max(c['io'][j]['max_gap_ms'] for j in c['io'])
                 for c in cycles_out]),
            'reload_s_median': bench.median(
                [c['reload_s'] for c in cycles_out])}
    out['control_max_gap_ms'] = max(v['max_gap_ms']
                                    for v in out['control'].values())
    results.put('swap_pause', out)


# --------------------------------------------------------------------------
# 5. The monitor's cost per tick
# --------------------------------------------------------------------------

class CountingExecute(object):
    """Cinder's utils.execute, counting the commands it runs."""

    def __init__(self):
        from cinder.common import config  # noqa: F401
        from cinder import utils
        self._execute = utils.execute
        self.commands = []

    def __call__(self, *cmd, **kwargs):
        self.commands.append(cmd)
        return self._execute(*cmd, **kwargs)


def _concise_create(entries):
    """Create many dm devices with one dmsetup call per 100 devices."""
    for i in range(0, len(entries), 100):
        spec = ';'.join('%s,%s,,,%s' % e for e in entries[i:i + 100])
        testbed.run(['dmsetup', 'create', '--concise', spec], timeout=600)


def test_monitor_cost(results, topo, lvs, scale):
    """HydrationMonitor.tick over 1, 100, 1000 clone targets.

    The targets are tiny (256 KiB, 4 regions of 64 KiB) with hydration
    off: each has its own metadata and destination (linear slices of two
    LVs) and all read one dm 'zero' device; they are named like the
    driver's handles, so the monitor treats them as volumes in transfer.
    """
    counts = [1, 100, 1000] if scale == 'full' else [1, 100]
    ticks = 5
    clone_kib, meta_kib = 256, 1024
    vg = topo.b.vg
    n_max = max(counts)
    meta_lv = lvs.make(vg, n_max * meta_kib * KiB)
    dest_lv = lvs.make(vg, n_max * clone_kib * KiB)
    # zero every metadata slice's superblock area
    fd = os.open(meta_lv, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4 * KiB)
    try:
        for i in range(n_max):
            os.pwritev(fd, [buf], i * meta_kib * KiB)
        os.fsync(fd)
    finally:
        os.close(fd)
    clone_sectors = clone_kib * KiB // bench.SECTOR
    meta_sectors = meta_kib * KiB // bench.SECTOR
    testbed.run(['dmsetup', 'create', 'bench-zero', '--uuid',
                 'BENCH-bench-zero', '--table',
                 '0 %d zero' % clone_sectors])
    made = []
    out = {}
    execute = CountingExecute()
    dm = privileged.DMSetup(execute=execute)
    seen_lv = []

    def on_status(lv_name, status, progress):
        seen_lv.append(lv_name)

    monitor = hydration.HydrationMonitor(dm, vg, on_status, interval=10)
    built = 0
    try:
        for n in counts:
            entries, clones = [], []
            for i in range(built, n):
                meta, dest = 'bench-m%04d' % i, 'bench-d%04d' % i
                entries.append((meta, 'BENCH-' + meta, '0 %d linear %s %d' % (
                    meta_sectors, meta_lv, i * meta_sectors)))
                entries.append((dest, 'BENCH-' + dest, '0 %d linear %s %d' % (
                    clone_sectors, dest_lv, i * clone_sectors)))
                made += [meta, dest]
                name = layout.handle_name(vg, 'volume-bench-%04d' % i)
                clones.append((name, 'BENCH-' + name, str(dms.clone_segment(
                    0, clone_sectors, '/dev/mapper/' + meta,
                    '/dev/mapper/' + dest, '/dev/mapper/bench-zero', 128))))
                made.append(name)
            built = n
            t_create, _ = bench.timed(_concise_create, entries)
            t_clones, _ = bench.timed(_concise_create, clones)
            monitor.tick()   # the first tick has no previous sample
            per_tick, commands, seen = [], [], []
            for _ in range(ticks):
                del execute.commands[:]
                del seen_lv[:]
                took, report = bench.timed(monitor.tick)
                per_tick.append(took)
                commands.append(len(execute.commands))
                seen.append(report.seen)
            raw = []
            for _ in range(ticks):
                took, _ = bench.timed(testbed.run, ['dmsetup', 'status',
                                                    '--target', 'clone'])
                raw.append(took)
            out[str(n)] = {
                'tick_s_median': bench.median(per_tick),
                'tick_s': per_tick,
                'dmsetup_status_s_median': bench.median(raw),
                'commands_per_tick': commands,
                'clones_seen_per_tick': seen,
                'create_devices_s': round(t_create + t_clones, 3),
            }
            testbed.LOG.info('monitor with %d clones: %s', n, out[str(n)])
            assert set(commands) == {1}, commands
            assert set(seen) == {n}, seen
            results.put('monitor_cost', out)
    finally:
        for i in range(0, len(made), 200):
            chunk = [m for m in made[i:i + 200]
                     if m.startswith('dmclone-')]
            if chunk:
                testbed.run(['dmsetup', 'remove'] + chunk, check=False)
        for i in range(0, len(made), 200):
            chunk = [m for m in made[i:i + 200]
                     if not m.startswith('dmclone-')]
            if chunk:
                testbed.run(['dmsetup', 'remove'] + chunk, check=False)
        testbed.run(['dmsetup', 'remove', 'bench-zero'], check=False)
    base = out[str(counts[0])]['tick_s_median']
    for v in out.values():
        v['tick_ratio_to_one'] = v['tick_s_median'] / base
    results.put('monitor_cost', out)
