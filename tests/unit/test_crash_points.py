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

"""The fault suite's crash points fire where their names say.

The real-kernel fault suite (tests/faults/test_crash.py) kills a volume
service at the steps named in ``tests.harness.volume_node.CRASH_POINTS``
by wrapping a method of the driver's classes.  It runs only in the
testbed, rarely: a renamed method or a reordered teardown would make a
point fire somewhere else, or never, and the scenario pass or fail for
the wrong reason.  Here every point must name something that exists, and
each teardown point (rollback, kept clone, abort, delete) is armed in the
two-node unit model's flow of its phase, with ``os.kill`` replaced by the
model's crash: it must fire exactly once and the flow still end as the
unit crash matrix expects.  (The points on the harness's SocketRPC and on
Cinder's clear_volume have no counterpart in the model.)
"""

import importlib
import inspect

import ddt
import oslo_messaging

from cinder import exception
from cinder.objects import fields
from cinder.tests.unit import test

from tests.harness import fake_cluster
from tests.harness import volume_node

PHASES = ('prepare', 'commit', 'finalize', 'rollback', 'held', 'abort',
          'delete', 'wipe')
IN_MODEL = [p for p in volume_node.CRASH_POINTS
            if p.split(':')[0] in ('rollback', 'held', 'abort', 'delete')
            and volume_node.CRASH_POINTS[p][1] != 'SocketRPC']


def _target(point):
    module, cls, attr, when, match = volume_node.CRASH_POINTS[point]
    owner = importlib.import_module(module)
    if cls is not None:
        owner = getattr(owner, cls)
    return owner, attr


@ddt.ddt
class CrashPointsTestCase(test.TestCase):

    @ddt.data(*volume_node.CRASH_POINTS)
    def test_names_a_step_that_exists(self, point):
        self.assertIn(point.split(':')[0], PHASES)
        owner, attr = _target(point)
        step = getattr(owner, attr)
        when, match = volume_node.CRASH_POINTS[point][3:]
        self.assertIn(when, ('before', 'after'))
        if match is not None:
            # The matcher takes what the step takes (self included).
            required = [p for p in inspect.signature(step).parameters.values()
                        if p.default is p.empty
                        and p.kind == p.POSITIONAL_OR_KEYWORD]
            inspect.signature(match).bind(*range(len(required)))

    def test_phases_keep_their_order(self):
        self.assertEqual(
            ['rollback: handle removed', 'rollback: source logged out',
             'rollback: data LV handed to the wiper',
             'rollback: metadata LV removed',
             'rollback: record back on the source',
             'rollback: source released', 'rollback: state cleared'],
            volume_node.crash_points('rollback'))
        self.assertEqual(4, len(volume_node.crash_points('abort')))
        self.assertEqual(6, len(volume_node.crash_points('delete')))

    # -- fired in the unit model -------------------------------------------

    def arm(self, point):
        """volume_node.arm_crash, with the model's crash for the kill."""
        owner, attr = _target(point)
        original = getattr(owner, attr)
        self.mock_object(owner, attr, original)     # restored afterwards
        fired = []

        def kill(pid, sig):
            fired.append(point)
            setattr(owner, attr, original)          # the process is gone
            raise fake_cluster.Crash(point)
        self.mock_object(volume_node.os, 'kill', side_effect=kill)
        volume_node.arm_crash(point)
        return fired

    @staticmethod
    def retried(call, *args):
        for attempt in range(3):
            try:
                return call(*args)
            except (oslo_messaging.MessagingTimeout,
                    exception.VolumeBackendAPIException):
                continue

    @ddt.data(*IN_MODEL)
    def test_fires_once_in_its_flow(self, point):
        phase = point.split(':')[0]
        c = fake_cluster.Cluster(self)
        self.mock_object(volume_node, 'service_host',
                         side_effect=lambda key: 'node-%s@dmclone' % key)
        getattr(self, 'flow_' + phase)(c, point)

    def flow_rollback(self, c, point):
        src = c.attach(c.a)[0]
        dst = c.attach(c.b)[0]
        fired = self.arm(point)
        self.retried(c.detach, dst)
        c.settle()
        self.assertEqual([point], fired)
        self.assertEqual([src], c.attachments)
        c.assert_rolled_back()

    def flow_held(self, c, point):
        src = c.attach(c.a)[0]
        dst = c.attach(c.b)[0]
        c.b.dm.write(fake_cluster.HANDLE)
        fired = self.arm(point)
        self.retried(c.detach, dst)
        c.settle()
        self.assertEqual([point], fired)
        self.assertEqual('cloned', c.transfer().state)
        self.assertEqual('node-a', c.transfer_keys().get(
            'dmclone_stale_source_attachment'))
        c.detach(src)
        c.settle()
        c.assert_completed()

    def flow_abort(self, c, point):
        # As tests/harness/volume_node.arm_withdrawn_attach: armed once
        # the clone is built, when the attach is withdrawn.
        build = c.b.dest.build_clone
        fired = []

        def build_then_withdraw(*args, **kwargs):
            path = build(*args, **kwargs)
            c.attachments[:] = [
                a for a in c.attachments if a['attach_status']
                != fields.VolumeAttachStatus.RESERVED]
            fired.append(self.arm(point))
            return path
        self.mock_object(c.b.dest, 'build_clone',
                         side_effect=build_then_withdraw)
        c.attach(c.a)
        self.assertRaises(exception.VolumeBackendAPIException,
                          c.attach, c.b)
        c.settle()
        self.assertEqual([[point]], fired)
        c.assert_rolled_back(aborted_ok=True)

    def flow_delete(self, c, point):
        dst = c.attach(c.b)[0]
        c.detach(dst)
        fired = self.arm(point)
        self.retried(c.delete)
        c.settle()
        self.assertEqual([point], fired)
        c.assert_deleted()
