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

"""kill -9 of a volume service at every step of a live migration's move.

The destination's service (node B) kills itself with SIGKILL right after
a step of the move's state machine (``cinder_node.CRASH_POINTS``: the
prepare, commit and finalize steps of cinder_dmclone.destination and
cinder_dmclone.clone), or the
source's service dies during hydration, or node B "reboots".  Each
scenario writes known data before and during the move, restarts what
died, retries what Nova would retry (the attach, the detach), and checks
the end: the volume on node A only with the same data (a move that never
committed), or on node B only with all the writes (a committed one).
The leak check then finds nothing left on either node.
"""

import time

import pytest

from tests.faults import helpers
from tests.functional import cinder_node
from tests.functional import test_transfer as tt
from tests.functional import testbed

REGION = helpers.REGION
POINTS = list(cinder_node.CRASH_POINTS)


def _live_migration_start(cluster, seed_value):
    vid, image = tt.seeded_volume(cluster, seed_value)
    att_a, info_a = cluster.attach(vid, 'a')
    return vid, image, att_a, info_a['data']['device_path']


@pytest.mark.parametrize('point', POINTS)
def test_destination_killed(cluster, fault, point):
    fault.scenario = 'kill -9 destination after %s' % point
    seed_value = 100 + 10 * POINTS.index(point)
    vid, image, att_a, path_a = _live_migration_start(cluster, seed_value)
    phase = point.split(':')[0]

    if phase == 'prepare':
        cluster['b'].call(cinder_node.arm_crash, point)
        with pytest.raises(Exception):
            cluster.attach(vid, 'b')
        # The instance goes on writing on A; the move never happened.
        image.write(path_a, 7 * REGION,
                    testbed.pattern(seed_value + 5, REGION))
        helpers.restart(cluster, 'b', fault)
        helpers.stays_on_a(cluster, vid, image.digest())
        fault.detail = 'move refused, B cleaned at restart (state %s)' % (
            helpers.state(cluster, vid) or 'cleared')
        # Nova tries the live migration again: it now succeeds.
        att_b, info_b = cluster.attach(vid, 'b')
    else:
        att_b, info_b = cluster.attach(vid, 'b')
    path_b = info_b['data']['device_path']
    assert helpers.state(cluster, vid) == 'cloned'
    image.write(path_a, 9 * REGION, testbed.pattern(seed_value + 6, REGION))

    if phase == 'commit':
        cluster['b'].call(cinder_node.arm_crash, point)
        with pytest.raises(Exception):
            cluster.detach(vid, att_a)
        helpers.restart(cluster, 'b', fault)
        # Nova retries the detach of the source that timed out.
        cluster.detach(vid, att_a)
        fault.detail = 'detach retried after restart'
    else:
        cluster.detach(vid, att_a)
    assert helpers.state(cluster, vid) == 'hydrating'
    image.write(path_b, 11 * REGION + 4096,
                testbed.pattern(seed_value + 7, 8192))
    # Now, while node A still has the volume's LV (the base of the
    # image): a crash after the source was retired leaves none.
    expected = image.digest()

    if phase == 'finalize':
        cluster['b'].call(cinder_node.arm_crash, point)
        helpers.tick_until_dead(cluster, 'b')
        before = helpers.state(cluster, vid)
        helpers.restart(cluster, 'b', fault)
        fault.detail = 'state at the crash: %s' % (before or 'cleared')
    tt.finish_on_b(cluster, vid, expected, att_b)


def test_source_killed_during_hydration(cluster, fault):
    fault.scenario = 'kill -9 source during hydration'
    vid, image, att_a, path_a = _live_migration_start(cluster, 300)
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_b, info_b = cluster.attach(vid, 'b')
    cluster.detach(vid, att_a)                        # commit
    cluster.stop('a', kill=True)
    image.write(info_b['data']['device_path'], 20 * REGION,
                testbed.pattern(301, 2 * REGION))
    # The copy goes on (LIO serves it from node A's kernel); the
    # finalization waits for node A's service to retire its copy.
    testbed.wait_until(
        lambda: cluster['b'].call(cinder_node.tick) is not None
        and helpers.state(cluster, vid) == 'finalizing', 900,
        'finalization blocked on the dead source', interval=2)
    assert testbed.run(['test', '-e', tt.lv(vid, 'a')],
                       check=False).returncode == 0, 'source LV gone early'
    t0 = time.monotonic()
    cluster.start('a')
    tt.finish_on_b(cluster, vid, image.digest(), att_b)
    fault.recovered(t0)
    fault.detail = 'finalization waited in "finalizing" for the source'


def test_destination_reboot_during_hydration(cluster, fault):
    fault.scenario = 'reboot of the destination during hydration'
    vid, image, att_a, path_a = _live_migration_start(cluster, 310)
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_b, info_b = cluster.attach(vid, 'b')
    path_b = info_b['data']['device_path']
    image.write(path_b, 30 * REGION, testbed.pattern(311, 2 * REGION))
    cluster.detach(vid, att_a)                        # commit
    image.write(path_b, 40 * REGION + 512, testbed.pattern(312, 4096))
    testbed.run(['sync'])
    name = path_b.split('/')[-1]
    fault.detail = 'regions hydrated at the reboot: %s' % (
        testbed.dm_status(name).split()[6])
    helpers.reboot_b(cluster)
    t0 = time.monotonic()
    cluster.start('b')             # recovery rebuilds the clone
    fault.recovered(t0)
    assert ' clone ' in ' %s ' % testbed.dm_status(name)
    assert testbed.read_direct(path_b, 30 * REGION, 2 * REGION) == \
        testbed.pattern(311, 2 * REGION)
    tt.finish_on_b(cluster, vid, image.digest(), att_b)


@pytest.mark.parametrize('writes_on_source', [False, True])
def test_failed_live_migration(cluster, fault, writes_on_source):
    fault.scenario = 'failed live migration, destination detached %s ' \
        'writes on the source' % ('after' if writes_on_source else 'before')
    vid, image, att_a, path_a = _live_migration_start(
        cluster, 320 + int(writes_on_source))
    att_b, info_b = cluster.attach(vid, 'b')
    if writes_on_source:
        image.write(path_a, 0, testbed.pattern(325, 2 * helpers.MiB))
        assert testbed.read_direct(
            info_b['data']['device_path'], 0, 2 * helpers.MiB) == \
            testbed.pattern(325, 2 * helpers.MiB)
    cluster.detach(vid, att_b)                        # rollback
    assert helpers.state(cluster, vid) is None
    helpers.end_on_a(cluster, vid, image, att_a)
