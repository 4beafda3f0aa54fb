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

"""Turn a benchmark results file into its Markdown table and plot (host).

    python tests/bench/report.py RESULTS.json [MORE.json ...] OUT_DIR

Several results files are merged section by section, later files
winning (a benchmark re-run on its own: ``tox -e bench -- -- -k move``);
the merged file records where each section came from.  Writes
``results-<date>.json`` (the input plus the host's description),
``results-<date>.md`` and ``hydration-<date>.png`` into OUT_DIR.  Only the
standard library and matplotlib (for the plot); it never imports the
project, so it runs on the host after the guest has powered off.
"""

import json
import os
import platform
import shutil
import sys


def host_description():
    model = ''
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    model = line.split(':', 1)[1].strip()
                    break
        with open('/proc/meminfo') as f:
            mem_kib = int(f.readline().split()[1])
    except OSError:
        mem_kib = 0
    return {'cpu': model, 'cpus': os.cpu_count(),
            'mem_gib': round(mem_kib / 1024 / 1024, 1),
            'kernel': platform.release(),
            'virtualization': 'a VM without KVM; the guest is Debian\'s '
                              'user-mode-linux (one CPU, emulated syscalls)'}


def _f(value, fmt='%.2f'):
    return '-' if value is None else fmt % value


def _kib(b):
    return '%d KiB' % (b // 1024) if b < 1024 * 1024 else \
        '%d MiB' % (b // (1024 * 1024))


def markdown(data):
    s = data['sections']
    g, h = data['guest'], data.get('host', {})
    out = ['# cinder-dmclone benchmarks, %s' % data['started'][:10], '',
           'Machine: %s, %s CPUs, %s GiB (%s). Guest: kernel %s, %s CPU, '
           '%s MiB; %s; %s. Scale: %s. Project defaults measured: %s.'
           % (h.get('cpu'), h.get('cpus'), h.get('mem_gib'),
              h.get('virtualization'), g['kernel'], g['cpus'], g['mem_mib'],
              g['fio'], g['storage'], data['scale'],
              ', '.join('%s=%s' % kv for kv in sorted(
                  g['project_defaults_measured'].items()))),
           '', 'All figures are ratios between runs made side by side in '
           'this one guest; absolute speeds under emulation mean nothing.',
           '']
    origins = data.get('section_origin', {})
    if len(set(origins.values())) > 1:
        out += ['Merged from several testbed runs on this machine; the '
                'testbed run (and start time) of each section:', '']
        out += ['* %s: %s' % kv for kv in sorted(origins.items())]
        out.append('')
    wc = s.get('write_cost')
    if wc:
        out += ['## 1. 4k random write cost (ratio to the plain LV)', '',
                'fio %d s per run, median of %d; clones are fresh (nothing '
                'hydrated, hydration off), source over iSCSI.'
                % (wc['runtime_s'], wc['repetitions']), '',
                '| device | QD1 sync | QD16 | regions touched (QD1 / QD16) |',
                '|---|---|---|---|']
        jobs = wc['summary']
        for kind in jobs['qd1_sync']:
            a, b = jobs['qd1_sync'][kind], jobs['qd16'][kind]
            touched = '-'
            if kind.startswith('clone'):
                touched = '%.0f%% / %.0f%%' % (
                    100 * a['hydrated_fraction_after'],
                    100 * b['hydrated_fraction_after'])
            out.append('| %s | %sx | %sx | %s |' % (
                kind, _f(a['ratio_to_plain']), _f(b['ratio_to_plain']),
                touched))
        out.append('')
    ur = s.get('unhydrated_reads')
    if ur:
        out += ['## 2. Reads of unhydrated regions', '',
                '| job | clone / same iSCSI disk | iSCSI disk / local LV |',
                '|---|---|---|']
        for job, row in ur['summary'].items():
            out.append('| %s | %sx | %sx |' % (
                job, _f(row['clone_to_iscsi']), _f(row['iscsi_to_local'])))
        out.append('')
    hy = s.get('hydration')
    for net, title in (('veth', 'the testbed\'s veth, no added latency'),
                       ('netem', 'netem adding %s us each way'
                        % (hy or {}).get('netem', {}).get(
                            'delay_us_each_way'))):
        if not hy or 'raw_bytes_per_s_median' not in hy.get(net, {}):
            continue
        part = hy[net]
        out += ['## 3%s. Hydration throughput, %s (ratio to dd 1 MiB '
                'direct over the same iSCSI path)' % (
                    'a' if net == 'veth' else 'b', title), '',
                'Volume %s; raw copies: %s s; a point still running after '
                '%d s is stopped and rated on what it copied.'
                % (_kib(hy['size_bytes']),
                   ', '.join('%.1f' % r['seconds']
                             for r in part['raw_copies']), hy['cap_s'])]
        if 'iscsi_4k_read_clat_mean_us' in part:
            out[-1] += (' iSCSI 4k read latency with the delay: %.0f us.'
                        % part['iscsi_4k_read_clat_mean_us'])
        out += ['', '| region | threshold | batch | per batch | seconds '
                '| ratio to raw | note |', '|---|---|---|---|---|---|---|']
        for name, p in sorted(part['points'].items(), key=lambda kv: (
                kv[1]['region_bytes'], kv[1]['threshold'], kv[1]['batch'])):
            note = []
            if name == hy.get('kernel_default'):
                note.append('kernel default')
            if name == hy.get('project_default'):
                note.append('project default')
            if not p['complete']:
                note.append('stopped at %.0f%%' % (
                    100.0 * p['hydrated_bytes'] / hy['size_bytes']))
            out.append('| %s | %d | %d | %s | %.1f | %sx | %s |' % (
                _kib(p['region_bytes']), p['threshold'], p['batch'],
                _kib(p['region_bytes'] * p['batch']), p['seconds'],
                _f(p['ratio_to_raw']), ', '.join(note)))
        out.append('')
    ul = s.get('hydration_under_load')
    if ul:
        out += ['## 3c. Hydration with a tenant (4k randrw 50/50 QD1)', '',
                '| setting | hydration time with tenant / alone '
                '| tenant IOPS during hydration / hydration off |',
                '|---|---|---|']
        for label, v in ul.items():
            out.append('| %s (t%d b%d) | %sx | %sx |' % (
                label, v['threshold'], v['batch'],
                _f(v['hydration_slowdown']), _f(v['tenant_ratio'])))
        out.append('')
    sp = s.get('swap_pause')
    if sp and 'control' in sp:
        out += ['## 4. Swap of a hydrated clone to linear', '',
                'Longest gap between two I/O completions of a QD1 reader '
                'and a QD1 sync writer; %d swaps per variant.'
                % len(next(iter(sp['variants'].values()))), '',
                '| variant | longest gap, ms (median of swaps / max) '
                '| swap call, ms (median) |', '|---|---|---|',
                '| no swap (jitter) | - / %s | - |'
                % sp['control_max_gap_ms']]
        for variant in sp['variants']:
            v = sp[variant]
            out.append('| %s | %s / %s | %.0f |' % (
                variant, _f(v['median_of_max_gap_ms'], '%.0f'),
                v['max_gap_ms'], 1000 * v['reload_s_median']))
        out.append('')
    mc = s.get('monitor_cost')
    if mc:
        out += ['## 5. Hydration monitor, one tick', '',
                '| clone targets | dmsetup commands per tick '
                '| tick time / tick with 1 target | tick, ms '
                '| of which `dmsetup status --target clone`, ms |',
                '|---|---|---|---|---|']
        for n, v in sorted(mc.items(), key=lambda kv: int(kv[0])):
            out.append('| %s | %s | %sx | %.0f | %.0f |' % (
                n, ','.join(str(c) for c in sorted(
                    set(v['commands_per_tick']))),
                _f(v.get('tick_ratio_to_one')), 1000 * v['tick_s_median'],
                1000 * v['dmsetup_status_s_median']))
        out.append('')
    mv = s.get('move_end_to_end')
    if mv:
        out += ['## 6. Moving a volume end to end (attach on B until '
                'finalized; monitor ticked every second)', '',
                '| size | attach call, s | until finalized, s '
                '| seconds per GiB / smallest |', '|---|---|---|---|']
        for gb, v in sorted(mv['sizes'].items(), key=lambda kv: int(kv[0])):
            out.append('| %s GiB | %.1f | %.1f | %sx |' % (
                gb, v['attach_s'], v['total_s'],
                _f(v.get('seconds_per_gib_ratio_to_smallest'))))
        out.append('')
    rc = s.get('recovery')
    if rc:
        out += ['## 7. Service start on the destination with %d transfers '
                'in flight' % rc['transfers'], '',
                '| start of node B\'s service after kill -9 | seconds '
                '| extra per transfer, s |', '|---|---|---|',
                '| no transfer (baseline) | %.1f | - |'
                % rc['start_no_transfer_s'],
                '| clones still in the kernel (service crash) | %.1f | %.1f |'
                % (rc['start_after_crash_s'],
                   rc['start_after_crash_extra_per_transfer_s']),
                '| clones and sessions gone (reboot) | %.1f | %.1f |'
                % (rc['start_after_reboot_s'],
                   rc['start_after_reboot_extra_per_transfer_s']), '']
    tm = s.get('thin_move')
    if tm and tm.get('summary'):
        out += thin_move_markdown(tm)
    return '\n'.join(out)


def thin_move_markdown(tm):
    """Section 8: a thin volume's move against a thick one's (issue 19)."""
    sm, t = tm['summary'], tm['summary']['targets']
    floor = sm['time_noise_floor']
    out = ['## 8. Moving a thin %d GiB volume holding 1 GiB against a thick '
           '%d GiB volume holding 1 GiB (attach on B until finalized, '
           'thin map on)' % (tm['thin_gib'], tm['thick_gib']), '',
           'Moves in this order: %s; 1 GiB written on node A in %d chunks '
           '(scattered over the thin volume). Noise floor: slowest / '
           'fastest of the same kind (thin %s, thick %s); a time ratio '
           'within it is no result.%s'
           % (', '.join(tm['order']), tm['chunks'],
              _f(floor['thin'], '%.2fx'), _f(floor['thick'], '%.2fx'),
              '' if sm['every_read_settled'] else
              ' Some read counts did not settle before the source LV '
              'went (see the JSON): those are lower bounds.'), '',
           '| figure | measured | target |', '|---|---|---|',
           '| time to finalized, thin / thick (median) | %sx (pairs: %s) '
           '| at most %.1fx |' % (
               _f(sm['time_to_finalized_ratio']),
               ', '.join('%.2fx' % r
                         for r in sm['time_to_finalized_ratio_per_pair']),
               t['time_to_finalized_ratio_max']),
           '| attach call, thin / thick (median) | %sx | - |'
           % _f(sm['attach_ratio']),
           '| bytes read from the source per allocated byte, thin | %s '
           '| at most %.2f |' % (
               _f(sm['source_read_per_allocated']['thin'], '%.3f'),
               t['source_read_per_allocated_max']),
           '| the same, thick (a full copy: the measure\'s floor) | %s | - |'
           % _f(sm['source_read_per_allocated']['thick'], '%.3f'),
           '| destination / source allocation, thin (nothing written '
           'during the move) | %s | at most %.2f |' % (
               _f(sm['destination_per_source_allocation']['thin'], '%.3f'),
               t['destination_per_source_allocation_max']), '',
           '| move | kind | attach, s | until finalized, s | hydrated at '
           'attach | read from source | source allocated | destination '
           'allocated |', '|---|---|---|---|---|---|---|---|']
    for i, m in enumerate(tm['moves']):
        out.append('| %d | %s %d GiB | %.1f | %.1f | %s | %s%s | %s | %s |'
                   % (i + 1, m['kind'], m['size_gib'], m['attach_s'],
                      m['total_s'],
                      _f(None if m['hydrated_fraction_at_attach'] is None
                         else 100.0 * m['hydrated_fraction_at_attach'],
                         '%.1f%%'),
                      _kib(m['source_read_bytes']),
                      '' if m['source_read']['settled'] else ' (not settled)',
                      _kib(m['source_allocated_bytes']),
                      _kib(m['destination_allocated_bytes'])))
    out.append('')
    return out


def plot(data, path):
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot

    hy = data['sections']['hydration']
    parts = [(net, hy[net]) for net in ('veth', 'netem')
             if 'raw_bytes_per_s_median' in hy.get(net, {})]
    fig, axes = pyplot.subplots(1, len(parts), figsize=(6 * len(parts), 4.5),
                                squeeze=False)
    for ax, (net, part) in zip(axes[0], parts):
        for key, style in ((hy['project_default'], '-'),
                           (hy['kernel_default'], '--')):
            p = part['points'].get(key)
            if not p:
                continue
            label = '%s (%s)' % (
                'project defaults' if key == hy['project_default']
                else 'kernel defaults', key)
            ax.plot([x[0] for x in p['samples']],
                    [100.0 * x[1] for x in p['samples']], style,
                    label=label)
        raw_s = hy['size_bytes'] / part['raw_bytes_per_s_median']
        ax.plot([0, raw_s], [0, 100], ':', color='grey',
                label='raw copy, dd 1 MiB direct (average rate)')
        ax.set_xlabel('seconds since enable_hydration')
        ax.set_ylabel('regions hydrated, %')
        ax.set_title('%s volume over iSCSI, %s' % (
            _kib(hy['size_bytes']),
            'veth (no added latency)' if net == 'veth' else
            'netem +%d us each way' % part.get('delay_us_each_way', 0)))
        ax.set_ylim(0, 102)
        ax.grid(True, alpha=0.3)
        ax.legend(loc='lower right', fontsize='small')
    fig.suptitle('cinder-dmclone hydration progress, %s (UML guest: '
                 'compare shapes, not speeds)' % data['started'][:10])
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def merge(paths):
    """The first results file with the sections of the later ones."""
    data = None
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        origin = '%s (%s)' % (os.path.basename(os.path.dirname(
            os.path.dirname(os.path.dirname(path)))) or path,
            part['started'])
        # A file that is itself a merge says where its sections came from.
        origins = {k: part.get('section_origin', {}).get(k, origin)
                   for k in part['sections']}
        if data is None:
            data = part
            data['section_origin'] = origins
            continue
        data['sections'].update(part['sections'])
        data['section_origin'].update(origins)
    return data


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    data = merge(argv[1:-1])
    data['host'] = host_description()
    out_dir = argv[-1]
    os.makedirs(out_dir, exist_ok=True)
    date = data['started'][:10]
    base = os.path.join(out_dir, 'results-%s' % date)
    with open(base + '.json', 'w') as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write('\n')
    with open(base + '.md', 'w') as f:
        f.write(markdown(data) + '\n')
    print('wrote %s.json and %s.md' % (base, base))
    if 'raw_bytes_per_s_median' in data['sections'].get(
            'hydration', {}).get('veth', {}):
        png = os.path.join(out_dir, 'hydration-%s.png' % date)
        plot(data, png)
        print('wrote %s' % png)
    print()
    with open(base + '.md') as f:
        shutil.copyfileobj(f, sys.stdout)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
