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

"""cinder-dmclone's read commands against the real kernel, LVM and iSCSI.

Node B gets, under the driver's names (see cinder_dmclone.layout):

* a linear handle over a volume LV;
* a clone handle over node A's iSCSI export, hydration off, three regions
  written (a live migration in progress);
* a clone handle hydrating slowly from a dm-delay source (its rate and
  ETA are measured by the tool's two samples);
* a leftover metadata LV with no clone, and a ``dmclone-*`` device whose
  LV does not exist.

The command runs as a subprocess (``python -m cinder_dmclone.cmd.cli``,
the source tree on PYTHONPATH: the package is not installed in the guest,
so its commands come from ``cli.COMMANDS``, not from entry points); the
JSON of ``status -f json`` is checked against what the kernel itself
reports, then the tables and lists, and the deprecated
``cinder-dmclone-status`` alias.

Separate kernels: the tool runs on node B's kernel (this process's),
where every handle above is; the iSCSI source is an LV on node A's own
kernel, exported by node A's LIO (``iscsi_source``), and the dm-delay
source of the slow clone an LV of node B's VG (a clone's devices are all
in its own kernel).
"""

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.harness import testbed
from tests.harness.testbed import MiB

pytestmark = pytest.mark.layouts('separate')

REGION_SECTORS = 128                     # 64 KiB
REGION = REGION_SECTORS * testbed.SECTOR


def run_tool(topo, *args, alias=False):
    """``cinder-dmclone ARGS`` (``cinder-dmclone-status ARGS`` if alias)."""
    env = dict(os.environ)
    env['PYTHONPATH'] = topo.src
    if alias:
        argv = [sys.executable, '-c', 'import sys; from cinder_dmclone.cmd '
                'import cli; sys.exit(cli.status_alias())'] + list(args)
    else:
        argv = [sys.executable, '-m', 'cinder_dmclone.cmd.cli'] + list(args)
    testbed.LOG.info('$ %s', ' '.join(argv))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                          cwd='/', timeout=300)
    testbed.LOG.info('rc=%d stdout:\n%s\nstderr:\n%s', proc.returncode,
                     proc.stdout, proc.stderr)
    return proc


def volume_lv(make_lv, vg, size, vol_id):
    return make_lv(vg, size, name='volume-%s' % vol_id)


def metadata_lv(make_lv, topo, vol_id, size=4 * MiB):
    path = make_lv(topo.b.meta_vg, size, name='volume-%s-dmcmeta' % vol_id)
    testbed.zero_device(path, size)
    return path


@pytest.mark.extended
def test_status_tool_json(topo, make_lv, iscsi_source, cleanup, tmp_path):
    from cinder.common import config  # noqa: F401 (cinder's utils.execute)
    from cinder_dmclone import dmsetup
    from cinder_dmclone import layout
    from cinder_dmclone import privileged

    dm = privileged.DMSetup()
    vg = topo.b.vg
    ids = [str(uuid.uuid4()) for _ in range(5)]
    linear_id, iscsi_id, slow_id, meta_only_id, no_lv_id = ids

    def handle(vol_id, segments):
        lv = 'volume-%s' % vol_id
        name = layout.handle_name(vg, lv)
        dm.create(name, segments, uuid=layout.handle_uuid(vg, lv))
        cleanup(testbed.dm_remove, name)
        return name

    # a plain volume behind its linear handle
    size = 8 * MiB
    lv = volume_lv(make_lv, vg, size, linear_id)
    h_linear = handle(linear_id, [dmsetup.linear_segment(
        0, size // testbed.SECTOR, lv)])

    # a volume moving in over iSCSI, hydration off, 3 regions written
    size = 16 * MiB
    sectors = size // testbed.SECTOR
    src = iscsi_source(size)
    dest = volume_lv(make_lv, vg, size, iscsi_id)
    meta = metadata_lv(make_lv, topo, iscsi_id)
    h_iscsi = handle(iscsi_id, [dmsetup.clone_segment(
        0, sectors, meta, dest, src.disk, REGION_SECTORS)])
    for n in (1, 5, 9):
        testbed.write_direct(layout.handle_path(vg, 'volume-' + iscsi_id),
                             n * REGION, testbed.pattern(n, REGION))

    # a volume hydrating slowly: one region at a time, each source read
    # takes 100 ms, about a minute for the whole (the tool's start-up and
    # two samples fit in it)
    size = 32 * MiB
    sectors = size // testbed.SECTOR
    slow_lv = make_lv(topo.b.vg, size)
    testbed.run(['modprobe', 'dm-delay'])
    testbed.run(['dmsetup', 'create', 'ft-status-slow', '--table',
                 '0 %d delay %s 0 100' % (sectors, slow_lv)])
    cleanup(testbed.dm_remove, 'ft-status-slow')
    dest = volume_lv(make_lv, vg, size, slow_id)
    meta = metadata_lv(make_lv, topo, slow_id)
    h_slow = handle(slow_id, [dmsetup.clone_segment(
        0, sectors, meta, dest, '/dev/mapper/ft-status-slow',
        REGION_SECTORS, hydration=True, hydration_threshold=1,
        hydration_batch_size=1)])

    # leftovers: a metadata LV without a clone, a handle without an LV
    metadata_lv(make_lv, topo, meta_only_id)
    h_no_lv = handle(no_lv_id, [dmsetup.Segment(0, 8, 'zero')])

    proc = run_tool(topo, 'status', '--volume-group', vg,
                    '--metadata-volume-group', topo.b.meta_vg,
                    '--interval', '2', '-f', 'json')
    assert proc.returncode == 1, proc.stderr     # leftovers were found
    report = json.loads(proc.stdout)
    assert report['health'].startswith('attention: 2 leftovers')

    handles = {h['name']: h for h in report['handles']}
    assert {h_linear, h_iscsi, h_slow, h_no_lv} <= set(handles)
    assert handles[h_linear]['table'] == 'linear'
    assert handles[h_linear]['volume_id'] == linear_id
    assert handles[h_linear]['uuid'] == layout.handle_uuid(
        vg, 'volume-' + linear_id)
    assert handles[h_iscsi]['table'] == 'clone'
    assert handles[h_no_lv]['table'] == 'zero'
    assert not handles[h_no_lv]['lv_exists']
    assert all(handles[h]['lv_exists'] for h in (h_linear, h_iscsi, h_slow))

    transfers = {t['volume_id']: t for t in report['transfers']}
    assert set(transfers) == {iscsi_id, slow_id}

    t = transfers[iscsi_id]
    hydrated, total = testbed.clone_progress(h_iscsi)
    assert (t['hydrated_regions'], t['total_regions']) == (3, total)
    assert hydrated == 3 and total == 16 * MiB // REGION
    assert not t['hydration_enabled'] and not t['failed']
    # measured over the same two samples as the hydrating clone: nothing
    # copies in the background, so no time to go can be told
    assert t['rate_source'] == 'sampled'
    assert t['rate_bps'] == 0 and t['eta_seconds'] is None
    assert t['source_device'] == testbed.dm_devno(src.disk)
    link = '/dev/disk/by-path/ip-%s-iscsi-%s-lun-%d' % (
        src.export.portal, src.export.target_iqn, src.export.lun)
    if os.path.exists(link):
        assert (t['source_portal'], t['source_iqn']) == (
            src.export.portal, src.export.target_iqn)
    else:      # a kernel without a uevent helper has no by-path links
        testbed.LOG.warning('no %s: portal not checked', link)
        assert t['source_portal'] is None
    assert t['metadata_lv'] == 'volume-%s-dmcmeta' % iscsi_id
    assert t['metadata_lv_exists']

    t = transfers[slow_id]
    assert t['hydration_enabled'] and t['rate_source'] == 'sampled'
    assert t['total_regions'] == 32 * MiB // REGION
    assert 0 < t['hydrated_regions'] < t['total_regions'], \
        'the clone hydrated too fast (or not at all) to measure a rate'
    assert t['rate_bps'] > 0 and t['eta_seconds'] > 0
    assert report['interval_seconds'] >= 2
    hydrated_now, _total = testbed.clone_progress(h_slow)
    assert hydrated_now >= t['hydrated_regions']

    # (old copies other tests left being wiped may be listed too)
    leftovers = {(item['kind'], item['lv_name'])
                 for item in report['leftovers']
                 if item['kind'] != 'retiring_lv'}
    assert leftovers == {
        ('metadata_lv_without_clone', 'volume-%s-dmcmeta' % meta_only_id),
        ('handle_without_lv', 'volume-%s' % no_lv_id)}

    # the same through a cinder.conf backend section, as tables and lists
    conf = tmp_path / 'cinder.conf'
    conf.write_text(
        '[DEFAULT]\nenabled_backends = node-b\n'
        '[node-b]\nvolume_driver = cinder_dmclone.driver.'
        'DMCloneVolumeDriver\nvolume_group = %s\n'
        'dmclone_metadata_volume_group = %s\n' % (vg, topo.b.meta_vg))
    scope = ('--config-file', str(conf))
    proc = run_tool(topo, 'status', *scope, '--interval', '0')
    assert proc.returncode == 1, proc.stderr
    assert 'metadata_lv_without_clone' in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if iscsi_id in ln)
    assert 'hydration off' in line
    assert '3/%d' % (16 * MiB // REGION) in line

    proc = run_tool(topo, 'move', 'list', *scope, '--interval', '0',
                    '-f', 'json')
    assert proc.returncode == 0, proc.stderr     # lists exit 0
    moves = {m['Volume']: m for m in json.loads(proc.stdout)}
    assert set(moves) == {iscsi_id, slow_id}
    assert moves[iscsi_id]['State'] == 'hydration off'
    proc = run_tool(topo, 'handle', 'list', *scope, '-f', 'value',
                    '-c', 'Handle')
    assert proc.returncode == 0, proc.stderr
    assert {h_linear, h_iscsi, h_slow, h_no_lv} <= set(proc.stdout.split())
    proc = run_tool(topo, 'leftover', 'list', *scope, '-f', 'csv')
    assert proc.returncode == 0, proc.stderr
    assert 'metadata_lv_without_clone' in proc.stdout
    assert 'handle_without_lv' in proc.stdout

    # the deprecated alias: the same report, and one line on stderr
    proc = run_tool(topo, *scope, '--interval', '0', '--json', alias=True)
    assert proc.returncode == 1, proc.stderr
    # (after the eventlet warning of cinder's import, if any)
    assert 'cinder-dmclone-status is deprecated' in proc.stderr
    assert {t['volume_id'] for t in json.loads(proc.stdout)['transfers']} \
        == {iscsi_id, slow_id}
