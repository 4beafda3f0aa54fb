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

"""The demo: a volume moves from node A to node B, with progress.

Run by tools/run-demo.sh inside the testbed guest (pytest -s, so the
narrative reaches the terminal).  The driver of each node runs in its own
volume-service process, node A's in its own network namespace; the steps
are those Cinder's API and Nova take (create, attach, write, attach on the
other node, detach the source), and the hydration monitor runs on node B.
"""

import hashlib
import os
import time

from tests.functional import cinder_node
from tests.functional import cluster as cluster_mod
from tests.functional import testbed

MiB = testbed.MiB
GiB = 1024 * MiB


def say(text):
    print('\n==> %s' % text, flush=True)


def bar(fraction, width=40):
    done = int(round(fraction * width))
    return '[%s%s]' % ('#' * done, '.' * (width - done))


def sha(path, length):
    h = hashlib.sha256()
    for block in testbed.iter_direct(path, 0, length, 4 * MiB):
        h.update(block)
    return h.hexdigest()


def test_demo():
    topo = testbed.topology()
    say('Starting the volume services of node A (%s, network namespace '
        '%s) and node B (%s), both with the cinder-dmclone driver over '
        'their own LVM volume group.' % (topo.a.ip, topo.a.netns, topo.b.ip))
    os.environ['DMCLONE_DEMO'] = '1'          # quiet workers
    os.environ['PYTHONWARNINGS'] = 'ignore'
    cluster_mod.setup_database()
    cluster = cluster_mod.Cluster()
    try:
        cluster.start('a')
        cluster.start('b')
        run(cluster, topo)
    finally:
        cluster.close()


def run(cluster, topo):
    vid = cluster.create_volume('a')
    say('Created a 1 GiB volume %s on node A: LV %s/volume-%s behind the '
        'handle /dev/mapper/dmclone-%s-volume-%s.'
        % (vid, topo.a.vg, vid, topo.a.vg.replace('-', '--'), vid))

    att_a, info = cluster.attach(vid, 'a')
    path_a = info['data']['device_path']
    say('An instance on node A attached it: connection "%s", device %s.'
        % (info['driver_volume_type'], path_a))
    text = b'cinder-dmclone demo: this block was written on node A. '
    text = (text * 80)[:4096]
    for i in range(0, GiB, 64 * MiB):
        testbed.write_direct(path_a, i, text + testbed.pattern(i, MiB - 4096))
    expected = sha(path_a, GiB)
    print('    wrote a recognisable 1 MiB every 64 MiB; sha256 of the whole '
          'volume: %s' % expected)

    say('Live migration to node B begins: the instance attaches the volume '
        'on node B while node A still uses it.')
    t0 = time.monotonic()
    att_b, info_b = cluster.attach(vid, 'b')
    path_b = info_b['data']['device_path']
    md = cluster.admin_metadata(vid)
    print('    node B built a dm-clone target over node A\'s iSCSI export in '
          '%.1f s: %s, connection "%s", volume host now %s, transfer state '
          '"%s".' % (time.monotonic() - t0, path_b,
                     info_b['driver_volume_type'], cluster.volume(vid).host,
                     md.get('dmclone_state')))
    print('    clone: %s' % testbed.dm_status(path_b.split('/')[-1]))
    first = testbed.read_direct(path_b, 0, 4096)
    print('    node B reads (from node A, through the clone): %r...'
          % bytes(first[:56]))

    say('The migration completes: node A detaches. The move is committed '
        'and node B copies the data in the background; the instance keeps '
        'writing locally on node B.')
    cluster.detach(vid, att_a)
    note = b'written on node B during hydration'.ljust(4096, b'.')
    testbed.write_direct(path_b, 512 * MiB, note)
    h = hashlib.sha256()
    for block in testbed.iter_direct(path_b, 0, GiB, 4 * MiB):
        h.update(block)
    expected = h.hexdigest()
    start = time.monotonic()
    while True:
        cluster['b'].call(cinder_node.tick)
        md = cluster.admin_metadata(vid)
        if 'dmclone_state' not in md:
            break
        pct = float(md.get('dmclone_percent') or 0)
        rate = md.get('dmclone_rate_bps') or ''
        eta = md.get('dmclone_eta_seconds') or ''
        print('    %s %5.1f%%  %s  %s' % (
            bar(pct / 100), pct,
            '%6.1f MiB/s' % (int(rate) / MiB) if rate else '   ... MiB/s',
            'ETA %s s' % eta if eta else 'ETA ...'), flush=True)
        time.sleep(1)
    say('Hydrated in %.1f s. The monitor swapped the clone for a linear '
        'mapping, dropped the metadata LV and the iSCSI session, and node A '
        'removed its export and its old LV.' % (time.monotonic() - start))
    print('    node B table: %s' % testbed.dm_table(path_b.split('/')[-1]))
    print('    LVs now: %s' % ', '.join(n for n in testbed.list_lvs()
                                        if vid in n))
    final = sha(path_b, GiB)
    print('    sha256 on node B: %s' % final)
    print('    expected:         %s' % expected)
    assert final == expected, 'data differs!'
    say('Data identical. Cleaning up.')
    cluster.detach(vid, att_b)
    cluster.delete_volume(vid)
    print('\nDEMO OK: the volume moved from node A to node B with its data '
          'intact.')
