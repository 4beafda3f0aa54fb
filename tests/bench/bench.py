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

"""Helpers of the benchmarks (they run inside the testbed guest).

fio jobs and their logs, the results file, and the device plumbing the
measurements share (clones over node A's iSCSI export, built with the
project's own :class:`cinder_dmclone.privileged.DMSetup`).  Figures are
recorded as they come, so a benchmark that fails later loses nothing.
"""

import collections
import json
import os
import platform
import signal
import statistics
import subprocess
import tempfile
import time

from tests.harness import testbed

KiB = testbed.KiB
MiB = testbed.MiB
SECTOR = testbed.SECTOR


# --------------------------------------------------------------------------
# Results file
# --------------------------------------------------------------------------

class Results(object):
    """The machine-readable results, rewritten after every update."""

    def __init__(self, path, scale):
        self.path = path
        self.data = {
            'format': 1,
            'started': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
            'scale': scale,
            'guest': guest_description(),
            'sections': {},
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.save()

    def put(self, section, value):
        self.data['sections'][section] = value
        self.save()

    def save(self):
        self.data['updated'] = time.strftime('%Y-%m-%dT%H:%M:%SZ',
                                             time.gmtime())
        tmp = self.path + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(self.data, f, indent=1, sort_keys=True)
            f.write('\n')
        os.replace(tmp, self.path)


def guest_description():
    def first_line(cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=30).stdout
            return out.strip().splitlines()[0] if out.strip() else ''
        except (OSError, subprocess.SubprocessError):
            return ''
    mem_kib = 0
    with open('/proc/meminfo') as f:
        for line in f:
            if line.startswith('MemTotal:'):
                mem_kib = int(line.split()[1])
    from cinder_dmclone import opts
    separate = testbed.topology().separate
    defaults = {o.name: o.default for o in opts.dmclone_opts
                if o.name in ('dmclone_region_size',
                              'dmclone_hydration_threshold',
                              'dmclone_hydration_batch_size')}
    return {
        'kernel': platform.release(),
        'machine': platform.machine(),
        'cpus': os.cpu_count(),
        'mem_mib': mem_kib // 1024,
        'fio': first_line(['fio', '--version']),
        'dmsetup': first_line(['dmsetup', 'version']),
        'dm_clone_target': [t for t in first_line_all(['dmsetup', 'targets'])
                            if t.startswith('clone')],
        'layout': 'separate' if separate else 'one-kernel',
        'storage': ('every node its own user-mode-linux kernel, each VG '
                    'on a ubd disk over a sparse file of the run '
                    'directory; node A to node B over the run\'s virtual '
                    'switch' if separate else
                    'every VG on a loop device over a sparse file on tmpfs '
                    '(guest RAM); node A to node B over a veth pair inside '
                    'the same kernel'),
        'project_defaults_measured': defaults,
    }


def first_line_all(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines()]


# --------------------------------------------------------------------------
# fio
# --------------------------------------------------------------------------

def fio_args(filename, rw, bs='4k', iodepth=1, sync=False, runtime=10,
             name='bench', rwmixread=None, size=None):
    args = ['--name=%s' % name, '--filename=%s' % filename,
            '--rw=%s' % rw, '--bs=%s' % bs, '--direct=1',
            '--ioengine=%s' % ('psync' if iodepth == 1 else 'libaio'),
            '--iodepth=%d' % iodepth, '--time_based',
            '--runtime=%d' % runtime, '--randrepeat=1']
    if sync:
        args.append('--sync=1')
    if rwmixread is not None:
        args.append('--rwmixread=%d' % rwmixread)
    if size is not None:
        args.append('--size=%d' % size)
    return args


def _parse_fio_json(text):
    start = text.find('{')
    if start < 0:
        raise AssertionError('no JSON in fio output: %r' % text[-2000:])
    return json.loads(text[start:])


def _job_figures(job):
    out = {}
    for ddir in ('read', 'write'):
        d = job[ddir]
        if not d['total_ios']:
            continue
        clat = d['clat_ns']
        pct = clat.get('percentile', {})
        out[ddir] = {
            'iops': d['iops'],
            'bw_bytes': d['bw_bytes'],
            'ios': d['total_ios'],
            'clat_mean_us': clat['mean'] / 1000.0,
            'clat_p99_us': pct.get('99.000000', 0) / 1000.0,
            'clat_max_us': clat['max'] / 1000.0,
        }
    return out


def fio(filename, rw, **kwargs):
    """Run one fio job; return {'read'|'write': figures} (asserted sane)."""
    argv = ['fio', '--output-format=json'] + fio_args(filename, rw, **kwargs)
    proc = testbed.run(argv, timeout=kwargs.get('runtime', 10) + 300)
    job = _parse_fio_json(proc.stdout)['jobs'][0]
    if job.get('error'):
        raise AssertionError('fio job failed: %r' % job['error'])
    figures = _job_figures(job)
    assert figures, 'fio did no I/O on %s' % filename
    return figures


def total_iops(figures):
    return sum(d['iops'] for d in figures.values())


class FioBackground(object):
    """A fio run in the background with per-I/O or averaged logs.

    ``jobs`` is a list of fio_args() lists (one per job); ``log`` is
    'lat' (every completion, for gaps) or 'iops' (averaged every
    ``avg_ms``).  ``t0`` is the monotonic time fio was started.
    """

    def __init__(self, jobs, log='lat', avg_ms=500):
        self.dir = tempfile.mkdtemp(prefix='bench-fio-')
        self.prefix = os.path.join(self.dir, 'log')
        argv = ['fio', '--output-format=json']
        if log == 'lat':
            argv += ['--write_lat_log=%s' % self.prefix, '--log_avg_msec=0']
        else:
            argv += ['--write_iops_log=%s' % self.prefix,
                     '--log_avg_msec=%d' % avg_ms]
        for job in jobs:
            argv += job
        self.log = log
        self.njobs = len(jobs)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def stop(self):
        """Ask fio to finish now (it still writes its logs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def wait(self, timeout=600):
        out, err = self.proc.communicate(timeout=timeout)
        self.stdout, self.stderr = out, err
        return self.proc.returncode

    def entries(self, job_index):
        """[(time_ms, value, ddir)] of one job's log (1-based index)."""
        kind = 'clat' if self.log == 'lat' else 'iops'
        path = '%s_%s.%d.log' % (self.prefix, kind, job_index)
        rows = []
        with open(path) as f:
            for line in f:
                fields = [x.strip() for x in line.split(',')]
                if len(fields) >= 3:
                    rows.append((int(fields[0]), int(fields[1]),
                                 int(fields[2])))
        return rows

    def cleanup(self):
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def completion_gaps(rows):
    """Largest gap between consecutive completions, and the largest clat.

    ``rows`` come from a 'lat' log: (completion time ms, clat ns, ddir).
    """
    times = sorted(r[0] for r in rows)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {
        'ios': len(times),
        'max_gap_ms': max(gaps) if gaps else None,
        'max_clat_ms': max(r[1] for r in rows) / 1e6 if rows else None,
        'span_ms': times[-1] - times[0] if times else 0,
    }


def iops_in_window(rows, lo_ms, hi_ms):
    """Mean IOPS (all directions) over the log buckets in [lo, hi)."""
    buckets = collections.defaultdict(int)
    for t, value, _ddir in rows:
        if lo_ms <= t < hi_ms:
            buckets[t] += value
    if not buckets:
        return None
    return statistics.mean(buckets.values())


# --------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------

def dm():
    """The project's DMSetup over Cinder's utils.execute (as root)."""
    # utils.execute reads CONF.rootwrap_config: register cinder's options
    from cinder.common import config  # noqa: F401
    from cinder_dmclone import privileged
    return privileged.DMSetup()


def fill(path, size):
    """Write non-zero data over the first ``size`` bytes (fio's buffers)."""
    testbed.run(['fio', '--name=fill', '--filename=%s' % path,
                 '--rw=write', '--bs=1M', '--direct=1', '--ioengine=psync',
                 '--size=%d' % size, '--refill_buffers=1'], timeout=900)


def digests(path, offsets, length=MiB):
    """sha256 of ``length`` bytes at each offset (on the caller's node)."""
    return [testbed.sha256_of_device(path, length, offset)
            for offset in offsets]


def zero_head(path, length=64 * KiB):
    testbed.write_direct(path, 0, bytes(length))


class Lvs(object):
    """LVs made by a benchmark; removed by :meth:`remove_all`."""

    def __init__(self):
        self.made = []
        self.counter = 0

    def make(self, vg, size, prefix='bn'):
        self.counter += 1
        name = '%s%d' % (prefix, self.counter)
        path = testbed.create_lv(vg, name, size)
        self.made.append((vg, name))
        return path

    def remove(self, path):
        vg, name = path.split('/')[-2:]
        testbed.remove_lv(vg, name)
        self.made.remove((vg, name))

    def remove_all(self):
        while self.made:
            vg, name = self.made.pop()
            testbed.remove_lv(vg, name)


class Clone(object):
    """A clone target over ``source``: fresh destination and metadata LVs.

    Built with the project's table builder and DMSetup, hydration off
    (``no_hydration``) as the driver builds it; ``meta_vg`` picks where
    the metadata LV lives.
    """

    counter = 0

    def __init__(self, dmsetup, lvs, source, size, region_bytes, vg,
                 meta_vg, threshold=None, batch=None):
        from cinder_dmclone import dmsetup as dms
        from cinder_dmclone import layout
        Clone.counter += 1
        self.dm = dmsetup
        self.lvs = lvs
        self.size = size
        self.sectors = size // SECTOR
        self.region_bytes = region_bytes
        self.name = 'bench-clone-%d' % Clone.counter
        self.path = dms.device_path(self.name)
        self.dest = lvs.make(vg, size)
        meta_size = layout.metadata_size_bytes(size, region_bytes)
        self.meta = lvs.make(meta_vg, meta_size)
        zero_head(self.meta)
        self.dm.create(self.name, [dms.clone_segment(
            0, self.sectors, self.meta, self.dest, source,
            region_bytes // SECTOR, hydration_threshold=threshold,
            hydration_batch_size=batch)], 'BENCH-' + self.name)

    def status(self):
        return self.dm.status(self.name)[0].clone

    def event_nr(self):
        out = testbed.run(['dmsetup', 'info', '-c', '--noheadings', '-o',
                           'events', self.name]).stdout
        return int(out.strip())

    def hydrate(self, cap_s, sample_s=1.0):
        """Enable hydration; wait for the kernel's completion event.

        Returns {'seconds', 'complete', 'samples': [(t, fraction)]}: the
        end time comes from ``dmsetup wait`` (the dm event hydration
        raises when it completes), so the status sampling (every
        ``sample_s``) only draws the curve.  Stops after ``cap_s``.
        """
        events = self.event_nr()
        t0 = time.monotonic()
        self.dm.message(self.name, 'enable_hydration')
        samples = [(0.0, 0.0)]
        complete = False
        while True:
            waiter = subprocess.Popen(['dmsetup', 'wait', self.name,
                                       str(events)],
                                      stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            while True:
                try:
                    waiter.wait(timeout=sample_s)
                    break
                except subprocess.TimeoutExpired:
                    t = time.monotonic() - t0
                    st = self.status()
                    samples.append((round(t, 3), st.progress))
                    if st.fully_hydrated or t > cap_s:
                        break
            t = time.monotonic() - t0
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
            st = self.status()
            if st.fully_hydrated:
                complete = True
                samples.append((round(t, 3), 1.0))
                break
            if t > cap_s:
                samples.append((round(t, 3), st.progress))
                break
            events = self.event_nr()   # another event: wait again
        hydrated = st.hydrated_regions * self.region_bytes
        return {'seconds': round(t, 3), 'complete': complete,
                'hydrated_bytes': min(hydrated, self.size),
                'bytes_per_s': min(hydrated, self.size) / t,
                'samples': samples}

    def remove(self):
        self.dm.remove(self.name)
        self.lvs.remove(self.meta)
        self.lvs.remove(self.dest)


class Netem(object):
    """Added latency on both ends of the veth pair (sch_netem).

    ``delay_us`` each way, so the round trip grows by twice that.  The
    testbed's nodes share one kernel: without it the "network" has
    almost no latency, unlike any real one.
    """

    def __init__(self, delay_us):
        self.delay_us = delay_us

    def __enter__(self):
        testbed.run(['modprobe', 'sch_netem'])
        for node, dev in (('b', 'vethB'), ('a', 'vethA')):
            testbed.run(['tc', 'qdisc', 'replace', 'dev', dev, 'root',
                         'netem', 'delay', '%dus' % self.delay_us,
                         'limit', '100000'], node=node)
        return self

    def __exit__(self, *exc):
        for node, dev in (('b', 'vethB'), ('a', 'vethA')):
            testbed.run(['tc', 'qdisc', 'del', 'dev', dev, 'root'],
                        node=node, check=False)


def timed(fn, *args, **kwargs):
    t0 = time.monotonic()
    value = fn(*args, **kwargs)
    return time.monotonic() - t0, value


def median(values):
    return statistics.median(values) if values else None
