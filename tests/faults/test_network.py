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

"""The network between the nodes drops every packet for 30 s.

sch_netem on both ends of the veth pair: first a 2 ms delay each way so
that a 1 GiB hydration with the kernel's defaults (one region in flight)
lasts minutes, then ``loss 100%`` for the cut.  The cut is the fault
itself (30 s, well under open-iscsi's 120 s replacement timeout), not a
wait for something to happen.
"""

import threading
import time

import pytest

from tests.faults import helpers
from tests.functional import cinder_node
from tests.functional import test_transfer as tt
from tests.functional import testbed

REGION = helpers.REGION
CUT_S = 30


def netem(*args):
    for node, dev in (('b', 'vethB'), ('a', 'vethA')):
        testbed.run(['tc', 'qdisc', 'replace', 'dev', dev, 'root', 'netem']
                    + list(args), node=node)


def netem_off():
    for node, dev in (('b', 'vethB'), ('a', 'vethA')):
        testbed.run(['tc', 'qdisc', 'del', 'dev', dev, 'root'], node=node,
                    check=False)


@pytest.fixture
def slow_link(cleanup):
    testbed.run(['modprobe', 'sch_netem'])
    netem('delay', '2ms', 'limit', '100000')
    cleanup(netem_off)


def percent(cluster, volume_id):
    # <start> <length> clone <md block> <md used/total> <region sectors>
    # <hydrated/total regions> ...
    status = testbed.dm_status(tt.handle(volume_id, 'b').split('/')[-1])
    hydrated, total = status.split()[6].split('/')
    return 100.0 * int(hydrated) / int(total)


def test_cut_during_hydration(cluster, fault, slow_link):
    fault.scenario = 'network cut %d s during hydration' % CUT_S
    vid, image = tt.seeded_volume(cluster, 400)
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_a, _info = cluster.attach(vid, 'a')
    att_b, info_b = cluster.attach(vid, 'b')
    path = info_b['data']['device_path']
    # A whole-region write needs no copy: that region is local from now.
    image.write(path, 30 * REGION, testbed.pattern(401, REGION))
    cluster.detach(vid, att_a)                        # commit
    cluster['b'].call(cinder_node.tick)
    before = percent(cluster, vid)
    assert before < 90, 'hydration too fast to cut in the middle'

    netem('delay', '2ms', 'loss', '100%', 'limit', '100000')
    cut_at = time.monotonic()
    try:
        t0 = time.monotonic()
        assert testbed.read_direct(path, 30 * REGION, REGION) == \
            testbed.pattern(401, REGION)
        read_s = time.monotonic() - t0
        t0 = time.monotonic()
        image.write(path, 60 * REGION, testbed.pattern(402, REGION))
        write_s = time.monotonic() - t0
        during = percent(cluster, vid)
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
    finally:
        netem('delay', '2ms', 'limit', '100000')
    t0 = time.monotonic()
    netem_off()
    tt.wait_finalized(cluster, vid)
    fault.recovered(t0)
    fault.detail = ('%.0f%% hydrated at the cut; local read %.2f s and '
                    'whole-region write %.2f s during it' % (before, read_s,
                                                             write_s))
    testbed.LOG.info('cut: before %.1f%%, during %.1f%%', before, during)
    tt.assert_only_on_b(cluster, vid, image.digest())
    cluster.detach(vid, att_b)
    cluster.delete_volume(vid)


def test_cut_during_attach(cluster, fault, slow_link):
    fault.scenario = 'network cut %d s during the attach' % CUT_S
    vid, image = tt.seeded_volume(cluster, 410)
    att_a, info_a = cluster.attach(vid, 'a')
    netem('delay', '2ms', 'loss', '100%', 'limit', '100000')
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
    netem('delay', '2ms', 'limit', '100000')
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
    assert helpers.state(cluster, vid) == 'cloned'
    image.write(info_a['data']['device_path'], 5 * REGION,
                testbed.pattern(411, REGION))
    cluster.detach(vid, att_a)
    netem_off()
    tt.finish_on_b(cluster, vid, image.digest(), att_b)
