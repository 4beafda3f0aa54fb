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

"""The network between the nodes drops every packet.

sch_netem on both ends of the link between the nodes: first a 2 ms delay
each way so that a 1 GiB hydration with the kernel's defaults (one
region in flight) lasts minutes, then ``loss 100%`` for the cut.  The cut
is the fault itself, not a wait for something to happen: 30 s (well
under open-iscsi's 120 s replacement timeout), or longer than a bound
that matters (the transfer timeout of the attach, the replacement
timeout during hydration).

What is cut is the iSCSI traffic: in one kernel the veth pair carries
nothing else; between kernels each node's ``eth0`` also carries the
harness's commands, the peer calls, the database and etcd, so netem
takes only the packets to or from the iSCSI port there
(:func:`tests.harness.testbed.netem_on_port`).
"""

import threading
import time

import pytest

from tests.faults import helpers
from tests.harness import driver_steps
from tests.harness import testbed
from tests.harness import volume_node

REGION = helpers.REGION
GiB = 1024 * helpers.MiB
CUT_S = 30
#: the source's transfer timeout in the long attach cut, and that cut.
SHORT_TIMEOUT_S = 30
LONG_ATTACH_CUT_S = 100
#: past open-iscsi's replacement timeout (120 s): reads of regions not
#: copied yet fail instead of waiting.
LONG_HYDRATION_CUT_S = 150
STALL_S = 20


pytestmark = pytest.mark.layouts('one-kernel', 'separate')


def link():
    """(node, device) of both ends of the link between the nodes."""
    if testbed.topology().separate:
        return (('b', 'eth0'), ('a', 'eth0'))
    return (('b', 'vethB'), ('a', 'vethA'))


def netem(*args):
    """netem ``args`` on both ends of the link (see the module's doc)."""
    topo = testbed.topology()
    for node, dev in link():
        if topo.separate:
            unshaped(node, dev)
            commands = testbed.netem_on_port(dev, topo.iscsi_port, args)
        else:
            commands = [['tc', 'qdisc', 'replace', 'dev', dev, 'root',
                         'netem'] + list(args)]
        for argv in commands:
            testbed.run(argv, node=node)


def unshaped(node, dev):
    testbed.run(['tc', 'qdisc', 'del', 'dev', dev, 'root'], node=node,
                check=False)


def netem_off():
    for node, dev in link():
        unshaped(node, dev)


def slow():
    """2 ms each way: a hydration at the kernel's defaults lasts minutes."""
    netem('delay', '2ms', 'limit', '100000')


def cut():
    """The slow link, dropping every packet."""
    netem('delay', '2ms', 'loss', '100%', 'limit', '100000')


@pytest.fixture
def slow_link(cleanup):
    for node, _dev in link():
        testbed.run(['modprobe', '-a', 'sch_netem', 'sch_prio', 'cls_u32'],
                    node=node)
    slow()
    cleanup(netem_off)


def commit_and_finish(cluster, volume_id, image, att_a, att_b):
    """The live migration completes at full link speed; B alone holds it."""
    assert helpers.state(cluster, volume_id) == 'cloned'
    cluster.detach(volume_id, att_a)
    netem_off()
    driver_steps.finish_on_b(cluster, volume_id, image.digest(), att_b)


def restart_with(cluster, key, overrides, cleanup):
    """Run a node's service with other options for this test only."""
    cluster.stop(key)
    cluster.start(key, overrides)
    # The next test's cluster_running starts it again with the defaults.
    cleanup(cluster.stop, key)


def percent(cluster, volume_id):
    # <start> <length> clone <md block> <md used/total> <region sectors>
    # <hydrated/total regions> ...
    status = cluster.on_node('b', testbed.dm_status, driver_steps.handle(
        volume_id, 'b').split('/')[-1])
    hydrated, total = status.split()[6].split('/')
    return 100.0 * int(hydrated) / int(total)


def test_cut_during_hydration(cluster, fault, slow_link):
    fault.scenario = 'network cut %d s during hydration' % CUT_S
    vid, image = driver_steps.seeded_volume(cluster, 400)
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_a, _info = cluster.attach(vid, 'a')
    att_b, info_b = cluster.attach(vid, 'b')
    path = info_b['data']['device_path']
    # A whole-region write needs no copy: that region is local from now.
    image.write(path, 30 * REGION, testbed.pattern(401, REGION))
    cluster.detach(vid, att_a)                        # commit
    cluster['b'].call(volume_node.tick)
    before = percent(cluster, vid)
    assert before < 90, 'hydration too fast to cut in the middle'

    cut()
    cut_at = time.monotonic()
    try:
        t0 = time.monotonic()
        assert cluster.read(path, 30 * REGION, REGION) == \
            testbed.pattern(401, REGION)
        read_s = time.monotonic() - t0
        t0 = time.monotonic()
        image.write(path, 60 * REGION, testbed.pattern(402, REGION))
        write_s = time.monotonic() - t0
        during = percent(cluster, vid)
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
    finally:
        slow()
    # From node A's LV, which the finalization retires: take it now.
    expected = image.digest()
    t0 = time.monotonic()
    netem_off()
    driver_steps.wait_finalized(cluster, vid)
    fault.recovered(t0)
    fault.detail = ('%.0f%% hydrated at the cut; local read %.2f s and '
                    'whole-region write %.2f s during it' % (before, read_s,
                                                             write_s))
    testbed.LOG.info('cut: before %.1f%%, during %.1f%%', before, during)
    driver_steps.assert_only_on_b(cluster, vid, expected)
    cluster.detach(vid, att_b)
    cluster.delete_volume(vid)


def test_cut_during_attach(cluster, fault, slow_link):
    fault.scenario = 'network cut %d s during the attach' % CUT_S
    vid, image = driver_steps.seeded_volume(cluster, 410)
    att_a, info_a = cluster.attach(vid, 'a')
    cut()
    outcome = {}

    def attach():
        try:
            outcome['ok'] = cluster.attach(vid, 'b')
        except Exception as exc:
            outcome['error'] = exc
    worker = threading.Thread(target=attach)
    worker.start()
    time.sleep(CUT_S)
    t0 = time.monotonic()
    slow()
    worker.join(900)
    assert not worker.is_alive(), 'attach still hanging 900 s after the cut'
    fault.recovered(t0)
    if 'error' in outcome:
        fault.detail = 'attach failed cleanly (%s), retried after the cut' \
            % str(outcome['error']).splitlines()[0][:120]
        helpers.stays_on_a(cluster, vid, image.digest())
        att_b, info_b = cluster.attach(vid, 'b')
    else:
        fault.detail = 'attach waited out the cut and succeeded'
        att_b, info_b = outcome['ok']
    image.write(info_a['data']['device_path'], 5 * REGION,
                testbed.pattern(411, REGION))
    commit_and_finish(cluster, vid, image, att_a, att_b)


def test_cut_longer_than_the_transfer_timeout_during_attach(
        cluster, fault, slow_link, cleanup):
    """The source gives up, the volume stays usable where it was."""
    fault.scenario = ('network cut %d s during the attach, transfer '
                      'timeout %d s' % (LONG_ATTACH_CUT_S, SHORT_TIMEOUT_S))
    restart_with(cluster, 'a', {'dmclone_transfer_timeout': SHORT_TIMEOUT_S},
                 cleanup)
    vid, image = driver_steps.seeded_volume(cluster, 420)
    att_a, info_a = cluster.attach(vid, 'a')
    cut()
    cut_at = time.monotonic()
    try:
        with pytest.raises(Exception) as err:
            cluster.attach(vid, 'b')
        failed_s = time.monotonic() - cut_at
        # The instance on A never stopped: it writes during the cut.
        assert cluster.node_of(vid) == 'a'
        image.write(info_a['data']['device_path'], 7 * REGION,
                    testbed.pattern(421, REGION))
        time.sleep(max(0.0, LONG_ATTACH_CUT_S - (time.monotonic() - cut_at)))
    finally:
        slow()
    t0 = time.monotonic()
    # Node B may finish its part of the prepare late; the source recorded
    # the move as aborted, so B's monitor removes what it built.

    def b_is_clean():
        cluster['b'].call(volume_node.tick)
        return helpers.nothing_on_b(cluster, vid) == []
    testbed.wait_until(b_is_clean, 600, 'node B clean after the cut',
                       interval=3,
                       diagnostics=lambda: str(
                           helpers.nothing_on_b(cluster, vid)))
    fault.recovered(t0)
    helpers.stays_on_a(cluster, vid, image.digest())
    fault.detail = ('attach failed after %.0f s (%s); volume stayed on A, '
                    'retried after the cut' % (
                        failed_s, str(err.value).splitlines()[0][:100]))
    # The retry with the testbed's usual bound: a whole prepare under
    # emulation can take longer than the short one.
    cluster.stop('a')
    cluster.start('a')
    att_b, _info_b = cluster.attach(vid, 'b')
    commit_and_finish(cluster, vid, image, att_a, att_b)


def test_cut_past_the_iscsi_timeout_during_hydration(
        cluster, fault, slow_link, cleanup):
    """Hydration stalls, is reported, and resumes: nothing is lost."""
    fault.scenario = ('network cut %d s during hydration (past the iSCSI '
                      'replacement timeout)' % LONG_HYDRATION_CUT_S)
    restart_with(cluster, 'b', {'dmclone_stall_timeout': STALL_S}, cleanup)
    vid, image = driver_steps.seeded_volume(cluster, 430)
    source_digest = image.digest()
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_a, _info = cluster.attach(vid, 'a')
    att_b, info_b = cluster.attach(vid, 'b')
    path = info_b['data']['device_path']
    image.write(path, 30 * REGION, testbed.pattern(431, REGION))
    cluster.detach(vid, att_a)                        # commit
    cluster['b'].call(volume_node.tick)
    before = percent(cluster, vid)
    assert before < 90, 'hydration too fast to cut in the middle'
    # The seed's last 4 KiB: hydration goes in order, so still remote.
    tail = (image.size - 4096, testbed.pattern(433, 4096))
    expected = image.digest()

    cut()
    cut_at = time.monotonic()
    outcome = {}

    def read_tail():
        # In this thread of the tests' process, on node B's kernel (the
        # clone's), not through cluster.read: a node's worker takes one
        # call at a time.
        t0 = time.monotonic()
        try:
            outcome['data'] = testbed.read_direct(path, tail[0], 4096)
        except Exception as exc:
            outcome['error'] = exc
        finally:
            outcome['seconds'] = time.monotonic() - t0
    reader = threading.Thread(target=read_tail)
    try:
        reader.start()

        def stalled():
            cluster['b'].call(volume_node.tick)
            md = cluster.admin_metadata(vid)
            return int(md.get('dmclone_stalled_seconds') or 0) >= STALL_S
        testbed.wait_until(stalled, STALL_S * 3 + 60,
                           'the monitor reporting the stall', interval=3,
                           diagnostics=lambda: str(
                               cluster.admin_metadata(vid)))
        stall_seen_s = time.monotonic() - cut_at
        # What is local stays readable, the source still holds it all.
        assert cluster.read(path, 30 * REGION, REGION) == \
            testbed.pattern(431, REGION)
        assert cluster.sha256(driver_steps.lv(vid, 'a')) == source_digest
        time.sleep(max(0.0, LONG_HYDRATION_CUT_S
                       - (time.monotonic() - cut_at)))
    finally:
        slow()
    t0 = time.monotonic()
    netem_off()
    reader.join(300)
    assert not reader.is_alive(), 'a read still hangs 300 s after the cut'
    # Never wrong data: the read either failed or returned the volume's.
    if 'data' in outcome:
        assert outcome['data'] == tail[1]
        read = 'returned the right data after %.0f s' % outcome['seconds']
    else:
        assert isinstance(outcome['error'], OSError), outcome['error']
        read = 'failed after %.0f s (%s)' % (
            outcome['seconds'], outcome['error'].strerror)
    driver_steps.wait_finalized(cluster, vid)
    fault.recovered(t0)
    fault.detail = ('%.0f%% hydrated at the cut; stall reported after '
                    '%.0f s; a read of an uncopied region %s'
                    % (before, stall_seen_s, read))
    testbed.LOG.info('long cut: %s', fault.detail)
    driver_steps.assert_only_on_b(cluster, vid, expected)
    cluster.detach(vid, att_b)
    cluster.delete_volume(vid)
