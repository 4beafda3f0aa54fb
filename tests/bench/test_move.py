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

"""Time to move a volume end to end, through the real driver.

Both nodes' volume services run the driver (tests/harness/driver_cluster.py,
the functional suite's harness; conftest.py's ``cluster``, in either
layout); the benchmark plays Nova: it attaches a
volume of node A on node B (nothing else attached, so hydration starts at
once) and ticks node B's monitor every second, as a service with
``dmclone_monitor_interval = 1`` would, until the transfer is finalized
(swapped to linear, source export and LV removed).  Cinder sizes
volumes in whole GiB.  The volumes are not filled (filling takes longer
than the moves in the guest): their LVs read as zeros, which dm-clone
copies region by region like any other data.
"""

import time

import pytest

from tests.bench import bench
from tests.harness import driver_steps
from tests.harness import testbed
from tests.harness import volume_node

pytestmark = pytest.mark.layouts('one-kernel', 'separate')

GiB = 1024 * bench.MiB


def in_transfer(cluster, volume_id):
    return any(k.startswith('dmclone_state')
               for k in cluster.admin_metadata(volume_id))


def test_move_end_to_end(results, cluster, scale):
    sizes = [1, 2, 4] if scale == 'full' else [1]
    out = {}
    for gb in sizes:
        vid = cluster.create_volume('a', size_gb=gb)
        attachment = None
        try:
            t0 = time.monotonic()
            attachment, info = cluster.attach(vid, 'b')
            attach_s = time.monotonic() - t0
            assert info['driver_volume_type'] == 'local'
            ticks = 0
            while in_transfer(cluster, vid):
                assert time.monotonic() - t0 < 1800, 'move takes too long'
                time.sleep(1.0)
                cluster['b'].call(volume_node.tick)
                ticks += 1
            total_s = time.monotonic() - t0
            assert cluster.node_of(vid) == 'b'
        finally:
            if attachment is not None:
                cluster.detach(vid, attachment)
            cluster.delete_volume(vid)
        out[str(gb)] = {'size_gib': gb, 'attach_s': round(attach_s, 3),
                        'total_s': round(total_s, 3), 'ticks': ticks}
        testbed.LOG.info('move of %d GiB: %s', gb, out[str(gb)])
        results.put('move_end_to_end', {'sizes': out})
    one = out[str(sizes[0])]['total_s'] / sizes[0]
    for v in out.values():
        v['seconds_per_gib_ratio_to_smallest'] = \
            v['total_s'] / v['size_gib'] / one
    results.put('move_end_to_end', {
        'sizes': out, 'monitor_tick_every_s': 1.0})


def timed_start(cluster, key):
    t0 = time.monotonic()
    cluster.start(key)
    return round(time.monotonic() - t0, 3)


def test_recovery_with_transfers_in_flight(results, cluster, scale):
    """Startup of node B's service with transfers in flight into it.

    Live migrations half done (node A still attached, so every clone is
    ``cloned`` with hydration off and nothing finishes during the test).
    Three starts of node B's service, each after a kill -9: with no
    transfer (the baseline: a Python process importing Cinder), with the
    clones still in the kernel (a service crash: recovery checks each and
    keeps it), and with every clone and iSCSI session gone (a reboot:
    recovery logs in and rebuilds every clone from its metadata LV).
    The clones write nothing (hydration off), so 20 of 1 GiB fit in the
    guest's sparse volume groups.
    """
    count = 20 if scale == 'full' else 2
    out = {'transfers': count}
    cluster.stop('b', kill=True)
    out['start_no_transfer_s'] = timed_start(cluster, 'b')
    made = []
    try:
        for _ in range(count):
            vid = cluster.create_volume('a')
            att_a, _info = cluster.attach(vid, 'a')
            made.append([vid, att_a, None])
            made[-1][2], _info = cluster.attach(vid, 'b')
        assert all(cluster.admin_metadata(v)['dmclone_state'] == 'cloned'
                   for v, _a, _b in made)

        cluster.stop('b', kill=True)
        out['start_after_crash_s'] = timed_start(cluster, 'b')

        cluster.stop('b', kill=True)
        names = [driver_steps.handle(v, 'b').split('/')[-1]
                 for v, _a, _b in made]
        testbed.run(['dmsetup', 'remove', '--force'] + names)
        testbed.run(['iscsiadm', '-m', 'node', '--logoutall=all'],
                    check=False)
        assert testbed.iscsi_sessions() == {}
        out['start_after_reboot_s'] = timed_start(cluster, 'b')
        for name in names:
            assert ' clone ' in ' %s ' % testbed.dm_status(name), name
    finally:
        for vid, att_a, att_b in made:
            if att_b is not None:
                cluster.detach(vid, att_b)          # roll back
            cluster.detach(vid, att_a)
            cluster.delete_volume(vid)
    base = out['start_no_transfer_s']
    for key in ('start_after_crash_s', 'start_after_reboot_s'):
        out[key.replace('_s', '_extra_per_transfer_s')] = round(
            (out[key] - base) / count, 3)
    testbed.LOG.info('recovery: %s', out)
    results.put('recovery', out)
