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

"""Scenario steps over the driver's two volume services.

What the tests of :class:`driver_cluster.Cluster` (the functional suite's
test_transfer.py, the fault suite, the move benchmark) do again and
again: a volume of node A with known data and the :class:`Image` of what
it must read, node B's monitor ticked until a move is finalized, and the
check that node B alone holds the volume afterwards.  Testbed guest only;
a node's devices are read and written on its own kernel
(:meth:`driver_cluster.Cluster.on_node`).
"""

import hashlib
import os

from tests.harness import driver_cluster
from tests.harness import testbed
from tests.harness import volume_node

MiB = testbed.MiB
GiB = 1024 * MiB
REGION = 64 * 1024


def handle(volume_id, node):
    vg = testbed.topology().node(node).vg.replace('-', '--')
    return '/dev/mapper/dmclone-%s-volume-%s' % (vg, volume_id)


def lv(volume_id, node):
    return '/dev/%s/volume-%s' % (testbed.topology().node(node).vg,
                                  volume_id)


class Image(object):
    """The expected content of a volume: a base device plus our writes.

    The base is a node's LV (or handle); the writes go to whichever
    node's device the test names, on that node's kernel.
    """

    def __init__(self, cluster, base_path, size):
        self.cluster = cluster
        self.base_path = base_path
        self.size = size
        self.writes = []

    def write(self, path, offset, data):
        self.cluster.write(path, offset, data)
        self.writes.append((offset, bytes(data)))

    def digest(self):
        """sha256 of the base device with the writes applied on top."""
        node = driver_cluster.device_node(testbed.topology(), self.base_path)
        return self.cluster.on_node(node, digest_with_writes, self.base_path,
                                    self.size, self.writes)


def digest_with_writes(base_path, size, writes, chunk=4 * MiB):
    """sha256 of a device with ``writes`` applied on top of it.

    ``size`` bytes of ``base_path``, ``writes`` (offset, data); run on the
    base's kernel.
    """
    h = hashlib.sha256()
    pos = 0
    for block in testbed.iter_direct(base_path, 0, size, chunk):
        block = bytearray(block)
        for offset, data in writes:
            lo, hi = max(offset, pos), min(offset + len(data),
                                           pos + len(block))
            if lo < hi:
                block[lo - pos:hi - pos] = data[lo - offset:hi - offset]
        h.update(block)
        pos += len(block)
    return h.hexdigest()


#: devices an instance holds open, by path: the file descriptors, in the
#: process that looks at the device's node (Cluster.on_node)
_HELD = {}


def hold_open(path):
    """An instance opens ``path`` and keeps it open (call on its node)."""
    _HELD[path] = os.open(path, os.O_RDWR)


def write_held(path, offset, data):
    """The instance holding ``path`` writes ``data`` and syncs it."""
    os.pwrite(_HELD[path], data, offset)
    os.fsync(_HELD[path])


def release(path):
    """The instance holding ``path`` closes it."""
    os.close(_HELD.pop(path))


def seed(image, path, seed_value):
    """Known data at the start, a partial region, the middle, the end."""
    image.write(path, 0, testbed.pattern(seed_value, 4 * MiB))
    image.write(path, 100 * REGION + 4096,
                testbed.pattern(seed_value + 1, 8192))
    image.write(path, image.size // 2, testbed.pattern(seed_value + 2, MiB))
    image.write(path, image.size - 4096,
                testbed.pattern(seed_value + 3, 4096))


def seeded_volume(cluster, seed_value):
    """A 1 GiB volume on node A with known data; returns (id, Image)."""
    vid = cluster.create_volume('a')
    image = Image(cluster, lv(vid, 'a'), GiB)
    seed(image, handle(vid, 'a'), seed_value)
    return vid, image


def wait_finalized(cluster, volume_id, timeout=900):
    """Tick node B's monitor until the transfer state is gone."""
    def done():
        cluster['b'].call(volume_node.tick)
        return not any(k.startswith('dmclone_state')
                       for k in cluster.admin_metadata(volume_id))

    def diagnostics():
        return 'admin metadata: %s\nclone: %s' % (
            cluster.admin_metadata(volume_id),
            testbed.run(['dmsetup', 'status'], node='b', check=False).stdout)
    testbed.wait_until(done, timeout, 'transfer of %s finalized' % volume_id,
                       interval=2, diagnostics=diagnostics)


def nowhere(cluster, fn, *args):
    """What ``fn(*args)`` lists on each node's kernel, as {node: [...]}.

    (E.g. testbed.lio_targets, testbed.iscsi_sessions: ``{'a': [], 'b':
    []}`` when neither node has any.)
    """
    return {key: list(found)
            for key, found in cluster.on_each(fn, *args).items()}


def assert_only_on_b(cluster, volume_id, expected):
    b_path = handle(volume_id, 'b')
    assert cluster.node_of(volume_id) == 'b'
    table = cluster.on_node('b', testbed.dm_table,
                            b_path.split('/')[-1]).split()
    assert table[2] == 'linear', table
    assert not cluster.exists(lv(volume_id, 'a'))
    assert not any(volume_id in n
                   for n in cluster.on_node('a', testbed.handles, 'a'))
    assert nowhere(cluster, testbed.iscsi_sessions) == {'a': [], 'b': []}
    assert nowhere(cluster, testbed.lio_targets) == {'a': [], 'b': []}
    md = cluster.admin_metadata(volume_id)
    assert not [k for k in md if k.startswith('dmclone_')], md
    vol = cluster.volume(volume_id)
    assert vol.provider_location is None
    testbed.run(['sync'], node='b')
    # (node B's page cache: the tests' own kernel in both layouts)
    with open('/proc/sys/vm/drop_caches', 'w') as f:
        f.write('3')
    assert cluster.sha256(b_path) == expected


def finish_on_b(cluster, volume_id, expected, attachment):
    """Hydrate to the end, check node B alone holds the data, clean up."""
    wait_finalized(cluster, volume_id)
    assert_only_on_b(cluster, volume_id, expected)
    cluster.detach(volume_id, attachment)
    cluster.delete_volume(volume_id)
