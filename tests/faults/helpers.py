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

"""What the fault scenarios share: crash, restart, checks of both nodes.

Each check and action runs on the kernel of the node it concerns: node
B's through ``cluster.on_node('b', ...)`` or ``node='b'`` (the tests'
own kernel, so a plain call in both layouts), node A's through
``cluster.on_node('a', ...)`` and the cluster's path-routed
sha256/read/write/exists (a worker on node A's kernel when it has one).
"""

import time

from tests.harness import driver_steps
from tests.harness import testbed
from tests.harness import volume_node

MiB = testbed.MiB
REGION = driver_steps.REGION
SLOW = {'dmclone:hydration_threshold': '1',
        'dmclone:hydration_batch_size': '1'}
#: MiB of an old copy the wiper clears in the scenarios that wipe
#: (volume_clear_size: a whole 1 GiB LV takes minutes under emulation).
WIPE_MB = 4
#: The options of a node that wipes its old copies, as Cinder's LVM driver
#: does on delete (the testbed's default is volume_clear = none).
WIPING = {'volume_clear': 'zero', 'volume_clear_size': WIPE_MB}


def state(cluster, volume_id):
    return cluster.admin_metadata(volume_id).get('dmclone_state')


def restart(cluster, key, row=None, overrides=None):
    """Start a node's service again after its worker died; time it.

    ``overrides``: the driver options it ran with (see with_options).
    """
    assert not cluster.alive(key), 'the %s service did not die' % key
    cluster.forget(key)
    t0 = time.monotonic()
    cluster.start(key, overrides)
    cluster[key].info['overrides'] = dict(overrides or {})
    if row is not None:
        row.recovered(t0)


def with_options(cluster, key, overrides=None):
    """Run node ``key``'s service with these driver option overrides.

    None: the testbed's options.  The service is restarted only if it
    runs with others (one the harness started runs with none), so that
    scenarios in a row that need the same options pay one restart.
    """
    overrides = dict(overrides or {})
    worker = cluster.workers.get(key)
    if cluster.alive(key) and \
            (worker.info or {}).get('overrides', {}) == overrides:
        return
    if cluster.alive(key):
        cluster.stop(key)
    else:
        cluster.forget(key)
    cluster.start(key, overrides or None)
    cluster[key].info['overrides'] = overrides


def reboot_b(cluster):
    """Node B loses its service and its kernel state, as in a reboot.

    Simulated in both layouts, on node B's kernel: on separate kernels
    the tests run there, so it cannot be powered off under them
    (:meth:`Cluster.reboot` is for node A).
    """
    cluster.stop('b', kill=True)
    ours = cluster.on_node('b', testbed.handles, 'b')
    if ours:
        testbed.run(['dmsetup', 'remove', '--force'] + ours, node='b')
    testbed.run(['iscsiadm', '-m', 'node', '--logoutall=all'], node='b',
                check=False)
    assert cluster.on_node('b', testbed.iscsi_sessions) == {}
    return ours


def tick_until_dead(cluster, key, timeout=600):
    """Tick a node's monitor until the injected crash kills its worker."""
    deadline = time.monotonic() + timeout
    while cluster.alive(key):
        assert time.monotonic() < deadline, 'no crash within %d s: %s' % (
            timeout, testbed.run(['dmsetup', 'status'], node=key,
                                 check=False).stdout)
        try:
            cluster[key].call(volume_node.tick)
        except Exception:
            if cluster.alive(key):
                raise
            break
        time.sleep(1)


def nothing_on_b(cluster, volume_id):
    """No handle, LV, metadata LV or iSCSI session of the volume on B.

    Looked at on node B's kernel: anywhere else it would find nothing
    and pass.
    """
    problems = []
    devs = [n for n in cluster.on_node('b', testbed.dm_devices)
            if volume_id in n and 'dmc--b' in n]
    if devs:
        problems.append('dm devices %s' % devs)
    lvs = [n for n in cluster.on_node('b', testbed.list_lvs) if volume_id in n
           and n.startswith('dmc-b')]
    if lvs:
        problems.append('LVs %s' % lvs)
    sessions = cluster.on_node('b', testbed.iscsi_sessions)
    if sessions:
        problems.append('iSCSI sessions %s' % sessions)
    return problems


def wait_nothing_on_b(cluster, volume_id, timeout=300):
    """Until node B holds nothing of the volume (its wiper is done)."""
    testbed.wait_until(lambda: nothing_on_b(cluster, volume_id) == [],
                       timeout, 'nothing of %s left on node B' % volume_id,
                       interval=2,
                       diagnostics=lambda: str(nothing_on_b(cluster,
                                                            volume_id)))


def wipes(device_prefix, since=None):
    """Wipes of old copies that ran to the end, since ``since``.

    The ``dd`` from /dev/zero that Cinder's clear_volume runs, over a
    device whose path starts with ``device_prefix``; its verdict in the
    root command log is "ok" only if it exited 0.  ``since``: the logs'
    marks (volume_node.root_command_marks) before the scenario.
    """
    prefix = 'ok dd if=/dev/zero of=%s' % device_prefix
    return [line for line in volume_node.root_commands(since)
            if line.startswith(prefix)]


def old_copies_prefix(node_key, volume_id):
    """Path prefix of a volume's LVs renamed for the wiper on a node."""
    return '/dev/%s/volume-%s-dmcwipe-' % (
        testbed.topology().node(node_key).vg, volume_id)


def stays_on_a(cluster, volume_id, expected):
    """The move was undone: node A alone holds the volume, data intact."""
    assert cluster.node_of(volume_id) == 'a'
    assert state(cluster, volume_id) in (None, 'aborted'), \
        cluster.admin_metadata(volume_id)
    assert nothing_on_b(cluster, volume_id) == []
    assert cluster.sha256(driver_steps.handle(volume_id, 'a')) == expected


def end_on_a(cluster, volume_id, image, attachment):
    """The move was undone; the instance on A detaches, the volume goes."""
    stays_on_a(cluster, volume_id, image.digest())
    cluster.detach(volume_id, attachment)
    cluster.delete_volume(volume_id)
