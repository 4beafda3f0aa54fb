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

"""The demo: a volume moves from node A to node B and back, under Cinder.

Run by tools/run-demo.sh in the separate-kernel testbed (each node its own
guest kernel; pytest -s, so the narrative reaches the terminal).  It
starts the whole stack (MariaDB, RabbitMQ, etcd, cinder-api,
cinder-scheduler, one cinder-volume per node with this driver), creates a
volume on node A with the ``openstack`` CLI, attaches it to an "instance"
on node A the way Nova does, live-migrates that instance to node B, shows
the hydration progress that node B's monitor publishes, the swap to a
linear table, checks the data, then moves the volume back to node A with
the instance (a cold move this time) and checks the data there.
"""

import hashlib
import os
import sys
import time
import warnings

from tests.harness import api
from tests.harness import services
from tests.harness import testbed

MiB = testbed.MiB
GiB = 1024 * MiB
SIZE_GB = 2


def say(text):
    print('\n==> %s' % text, flush=True)


def show(text):
    print('    %s' % text, flush=True)


def bar(fraction, width=40):
    done = int(round(fraction * width))
    return '[%s%s]' % ('#' * done, '.' * (width - done))


def sha(path, length):
    h = hashlib.sha256()
    for block in testbed.iter_direct(path, 0, length, 4 * MiB):
        h.update(block)
    return h.hexdigest()


def sha_with(path, length, offset, block):
    """sha256 of the device as it will be once ``block`` is written."""
    h = hashlib.sha256()
    pos = 0
    for chunk in testbed.iter_direct(path, 0, length, 4 * MiB):
        chunk = bytes(chunk)
        if pos <= offset < pos + len(chunk):
            at = offset - pos
            chunk = chunk[:at] + block + chunk[at + len(block):]
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest()


def stderr_to(path):
    """From now on, this process's stderr and its children's go to ``path``.

    (Library warnings, such as eventlet's deprecation notice that the
    privsep daemon os-brick starts prints, belong in the run's log; pytest
    reports on stdout.)
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)


def test_demo():
    # The audience wants the narrative: library deprecation warnings
    # (eventlet, imported by os-brick here) stay off the console.
    warnings.simplefilter('ignore')
    topo = testbed.topology()
    stderr_to(os.path.join(topo.artifacts_dir, 'demo-stderr.log'))
    stack = services.Stack(topo)
    assert topo.separate, 'the demo runs with tools/testbed/run --layout ' \
        'separate (tools/run-demo.sh)'
    say('Starting a Cinder cloud in the testbed.  The control plane '
        '(MariaDB, RabbitMQ, etcd: the nodes\' shared lock service, '
        'cinder-api, cinder-scheduler) runs on the host, as "controller" '
        '(%s); one cinder-volume per node with the cinder-dmclone driver.  '
        'Each node is its own Linux kernel with its own LVM, LIO target and '
        'iSCSI initiator: node A (%s, VG %s) and node B (%s, VG %s).'
        % (topo.control.ip, topo.a.ip, topo.a.vg, topo.b.ip, topo.b.vg))
    t0 = time.monotonic()
    try:
        stack.start()
        show('all services up and both pools listed in %.0f s (%s)' % (
            time.monotonic() - t0, ', '.join(
                '%s %.0f s' % kv for kv in stack.timings.items())))
        cloud = api.Cloud(stack, worker_log=os.path.join(
            stack.log_dir, 'demo-workers.log'))
        cloud.ensure_volume_type()
        try:
            run(cloud, topo)
        finally:
            cloud.close()
    except BaseException:
        print(stack.diagnostics(), flush=True)
        raise
    finally:
        stack.stop()


def cli(cloud, *args, output=True):
    print('    $ openstack %s' % ' '.join(args), flush=True)
    return cloud.openstack(*args, output=output)


def run(cloud, topo):
    say('The operator\'s view: the volume services, one per node, each in '
        'its own availability zone.')
    for s in cli(cloud, 'volume', 'service', 'list'):
        show('%-18s %-22s %-6s %s' % (s['Binary'], s['Host'], s['Zone'],
                                      s['State']))

    say('A user creates a %d GiB volume in node A\'s zone.' % SIZE_GB)
    vol = cli(cloud, 'volume', 'create', '--size', str(SIZE_GB),
              '--availability-zone', 'az-a', 'demo-volume')
    vid = vol['id']
    v = cloud.wait_status(vid, 'available')
    show('volume %s is available on %s' % (vid, cloud.host_of(v)))

    say('An instance on node A attaches it (Nova: attachment create, '
        'update with node A\'s connector, os-brick connect, complete).')
    att_a = cloud.attach(vid, 'a')
    show('connection "%s": the instance uses %s directly, no network in '
         'the data path' % (att_a.connection_info['driver_volume_type'],
                            att_a.path))
    cloud.on_node('a', write_marks, att_a.path, SIZE_GB * GiB)
    show('the instance wrote a recognisable 1 MiB every 64 MiB')

    say('Live migration of the instance to node B begins: Nova attaches the '
        'volume on node B for the same instance while node A still uses '
        'it.')
    t0 = time.monotonic()
    att_b = cloud.attach(vid, 'b', instance=att_a.instance, migration=True)
    v = cloud.get(vid)
    show('in %.0f s node B built a dm-clone target over node A\'s iSCSI '
         'export (CHAP, ACL for node B only) and got a "%s" connection to '
         '%s' % (time.monotonic() - t0,
                 att_b.connection_info['driver_volume_type'], att_b.path))
    show('the volume now lives on %s (%s); transfer state "%s": no '
         'copying while node A still writes' % (
             cloud.host_of(v), v.availability_zone,
             cloud.transfer_state(vid).get('dmclone_state')))
    show('clone: %s' % testbed.dm_status(att_b.path.split('/')[-1]))
    show('node B reads node A\'s data through the clone: %r...'
         % bytes(testbed.read_direct(att_b.path, 0, 4096)[:40]))

    note = b'written on node B during hydration'.ljust(4096, b'.')
    expected = cloud.on_node('a', sha_with, att_a.path, SIZE_GB * GiB,
                             512 * MiB, note)
    show('sha256 of node A\'s copy with the block node B is about to '
         'write: %s' % expected)

    say('The migration completes: Nova removes node A\'s attachment. The '
        'move is committed; node B copies the rest in the background while '
        'the instance writes locally on node B.')
    cloud.detach(att_a)
    testbed.write_direct(att_b.path, 512 * MiB, note)
    follow(cloud, vid)
    say('Node B\'s monitor swapped the clone for a linear mapping, dropped '
        'the metadata LV and the iSCSI session, and node A removed its '
        'export and old LV.')
    show('node B table: %s' % testbed.dm_table(att_b.path.split('/')[-1]))
    show_lvs(cloud, vid)
    check(cloud, att_b, expected)
    show_api(cloud, vid)

    say('Back again: the instance stops on node B and starts on node A '
        '(a cold move this time: Nova detaches on B, attaches on A).')
    cloud.detach(att_b)
    t0 = time.monotonic()
    att_a = cloud.attach(vid, 'a')
    show('in %.0f s node A built its clone over node B\'s iSCSI export and '
         'got a "%s" connection to %s; the volume lives on %s again' % (
             time.monotonic() - t0,
             att_a.connection_info['driver_volume_type'], att_a.path,
             cloud.host_of(cloud.get(vid))))
    follow(cloud, vid)
    show('node A table: %s' % cloud.on_node(
        'a', testbed.dm_table, att_a.path.split('/')[-1]))
    show_lvs(cloud, vid)
    check(cloud, att_a, expected)
    show_api(cloud, vid)

    say('Data identical on both hops. Detaching and deleting.')
    cloud.detach(att_a)
    cloud.wait_status(vid, 'available')
    cli(cloud, 'volume', 'delete', vid, output=False)
    testbed.wait_until(lambda: vid not in [x.id for x in
                                           cloud.c.volumes.list()],
                       600, 'volume deleted', interval=2)
    print('\nDEMO OK: the volume moved from node A to node B and back with '
          'its data intact.', flush=True)


def write_marks(path, size):
    """A recognisable 1 MiB every 64 MiB (runs on the instance's node)."""
    text = (b'cinder-dmclone demo: written on node A. ' * 110)[:4096]
    for off in range(0, size, 64 * MiB):
        testbed.write_direct(path, off,
                             text + testbed.pattern(off, MiB - 4096))


def follow(cloud, vid):
    """Show the hydration's progress until the move is finalized."""
    start = time.monotonic()
    last = None
    while True:
        state = cloud.transfer_state(vid)
        if not state:
            break
        line = progress_line(state)
        if line != last:
            show(line)
            last = line
        time.sleep(1)
    show('hydrated and finalized in %.0f s' % (time.monotonic() - start))


def show_lvs(cloud, vid):
    for node in ('a', 'b'):
        lvs = testbed.lvm('lvs', '--noheadings', '-o', 'lv_name',
                          node=node).stdout.split()
        show('node %s LVs of the volume: %s' % (node.upper(), ', '.join(
            sorted(n for n in lvs if vid in n)) or 'none'))


def check(cloud, att, expected):
    final = cloud.on_node(att.node, sha, att.path, SIZE_GB * GiB)
    show('sha256 on node %s: %s' % (att.node.upper(), final))
    show('expected:         %s' % expected)
    assert final == expected, 'data differs!'


def show_api(cloud, vid):
    say('What the API says now:')
    shown = cli(cloud, 'volume', 'show', vid)
    for key in ('status', 'os-vol-host-attr:host', 'availability_zone'):
        show('%-24s %s' % (key, shown.get(key)))


def progress_line(state):
    pct = float(state.get('dmclone_percent') or 0)
    rate = state.get('dmclone_rate_bps')
    eta = state.get('dmclone_eta_seconds')
    return '%s %5.1f%%  %s  %s  (%s)' % (
        bar(pct / 100), pct,
        '%6.1f MiB/s' % (int(rate) / MiB) if rate else '   ... MiB/s',
        'ETA %4s s' % eta if eta else 'ETA  ... ',
        state.get('dmclone_state'))
