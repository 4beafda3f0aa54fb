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

Both nodes' volume services run the driver (tests/functional/cluster.py,
the functional suite's harness); the benchmark plays Nova: it attaches a
volume of node A on node B (nothing else attached, so hydration starts at
once) and ticks node B's monitor every second, as a service with
``dmclone_monitor_interval = 1`` would, until the transfer is finalized
(swapped to linear, source export and LV removed).  Cinder sizes
volumes in whole GiB.  The volumes are not filled (filling takes longer
than the moves in the guest): their LVs read as zeros, which dm-clone
copies region by region like any other data.
"""

import time

from tests.bench import bench
from tests.functional import cinder_node
from tests.functional import fixtures
from tests.functional import testbed

GiB = 1024 * bench.MiB

cluster = fixtures.cluster


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
                cluster['b'].call(cinder_node.tick)
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
