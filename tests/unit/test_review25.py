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

"""Review 25 (88719b7): abandon-source ending a stuck finalization.

The command now takes a move ``finalizing`` whose clone is not loaded
while its metadata LV is listed, and, when the scan finds no region
missing, ends it keeping the volume's status (``lost_regions`` 0).
Findings as expected failures, with controls.
"""

from unittest import mock

from oslo_db import exception as db_exc

from cinder import exception
from cinder.tests.unit import test

from cinder_dmclone import lost_source
from cinder_dmclone import move
from tests.harness import fake_cluster as cl
from tests.unit import test_lost_source as tls

REGIONS = tls.REGIONS


class LostWriteHarness(tls.Harness):
    """The Harness, but the source's last write of the commit is lost.

    Source.move (source.py:281-287) records the commit (``hydrating``),
    then points the volume record at node B: two writes.  The database
    goes away between them: the attach fails, the move stands (node B
    hydrates), and the record still names node A -- until the
    finalization's _name_this_node (destination.py:2254) repoints it.
    """

    def __init__(self, test, hydrated=range(100), reboot=False):
        real = move.Store.move_volume
        calls = []

        def lost_once(store, *args, **kwargs):
            calls.append(args)
            if len(calls) == 1:
                raise db_exc.DBConnectionError('database went away')
            return real(store, *args, **kwargs)
        patcher = mock.patch.object(move.Store, 'move_volume',
                                    autospec=True, side_effect=lost_once)
        patcher.start()
        test.addCleanup(patcher.stop)
        attach = cl.Cluster.attach

        def attach_failing(cluster, node, *args, **kwargs):
            try:
                return attach(cluster, node, *args, **kwargs)
            except Exception:
                # Nova gives up the attach; its reserved attachment goes.
                for att in list(cluster.attachments):
                    cluster.detach(att)
                return None, None
        with mock.patch.object(cl.Cluster, 'attach', attach_failing):
            super().__init__(test, hydrated=hydrated, reboot=reboot)


class StuckFinalizationNamingTheLostNodeTestCase(test.TestCase):
    """The volume record still names node A when the move ends."""

    def stuck(self, harness=LostWriteHarness):
        h = harness(self, hydrated=range(REGIONS), reboot=True)
        h.b.vg.lvs[cl.LV]['complete'] = True
        h.c.set_state(h.t, move.FINALIZING)     # the monitor's tick
        h.lose_a()
        h.c.restart(h.b)                        # node B loses power
        self.assertFalse(h.b.dm.exists(cl.HANDLE))
        self.assertEqual(move.FINALIZING, h.c.transfer().state)
        return h

    def test_control_the_record_names_node_b(self):
        h = self.stuck(tls.Harness)
        outcome = h.run()
        rec = h.c.db.volumes[cl.VOLUME_ID]
        self.assertEqual(0, outcome.uncopied_regions)
        self.assertEqual((h.b.host, 'available'),
                         (rec['host'], rec.get('status', 'available')))

    # HIGH (data loss, leak).  Sequence: node A commits the move of the
    # volume to node B (state hydrating) but the database goes away
    # before it points the volume record at node B (source.py:287):
    # the attach fails, Nova gives it up, the volume is 'available'
    # and its record names node A while node B hydrates.  Node B's
    # monitor finds it fully hydrated and records 'finalizing'; node B
    # loses power before the swap/removal of the metadata LV (so
    # before _retire_source -> _name_this_node, destination.py:2291,
    # which is the only step that repoints the record); node A is lost
    # for good.  The operator runs abandon-source on node B: it scans,
    # finds nothing missing, and ends the move keeping the volume
    # 'available' (lost_source.py:333-336, 533) without ever naming node B
    # (lost_source.py:_finish has no _name_this_node).  The volume is
    # now usable, with no move, and its record names the lost node A:
    # every request goes to node A; the only complete copy (node B's
    # LV) is described by nothing (no record, no old-copy key, the
    # volume exists so no start report); and when node A comes back its
    # service takes its own stale copy for the volume and serves it
    # (the writes made on node B are silently lost).  Pre-change the
    # volume was at least set to 'error'.
    # (Fixed: the command points the record at this node.)
    def test_the_record_names_the_node_that_holds_the_volume(self):
        h = self.stuck()
        rec = h.c.db.volumes[cl.VOLUME_ID]
        self.assertEqual(h.a.host, rec['host'])     # the lost write
        self.assertEqual('available', rec.get('status', 'available'))
        outcome = h.run()
        self.assertEqual(0, outcome.uncopied_regions)
        self.assertIsNone(h.c.transfer())
        rec = h.c.db.volumes[cl.VOLUME_ID]
        # Either the record names node B, or the volume is not left
        # usable on the lost node's word.
        self.assertTrue(rec['host'] == h.b.host
                        or rec.get('status') == 'error',
                        'volume %s on %s, its only whole copy on node-b'
                        % (rec.get('status', 'available'), rec['host']))

    def test_node_a_back_never_serves_its_stale_copy(self):
        # (The consequence before the fix: node A's service took its own
        # stale LV for the volume and attached it locally.)
        h = self.stuck()
        h.run()
        a = h.a
        a.down = False
        a.service_up = True
        h.c.restart(a)
        h.c.settle()
        self.assertEqual(h.b.host, h.c.db.volumes[cl.VOLUME_ID]['host'])
        try:
            att, info = h.c.attach(a)
        except exception.VolumeBackendAPIException as exc:
            # (node A's old copy, left for the operator, is in the way)
            self.assertIn(cl.LV, str(exc))
        else:
            # moved from node B, the whole copy, never node A's stale one
            self.assertEqual(h.b.host, h.c.transfer().source_host)
        self.assertEqual([], h.c.violations)


class RerunWithoutItsMetadataTestCase(test.TestCase):
    """A run cut short before the scan, then the metadata LV gone."""

    def cut_short(self):
        h = tls.Harness(self, hydrated=range(100), reboot=True)
        h.lose_a()
        written = iter(range(1000, 2000))
        h.after_probe = lambda: h.set_hydrated(h.hydrated
                                               | {next(written)})
        # (The instance keeps writing: "stop its I/O and run again".)
        self.assertRaises(tls.lost_source.ScanRaced, h.run)
        h.after_probe = None
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.assertNotIn('dmclone_lost_regions',
                         h.c.db.admin_metadata[cl.VOLUME_ID])
        self.assertEqual([], h.zeroed)
        return h

    def test_control_rerun_with_its_metadata_ends_it_in_error(self):
        h = self.cut_short()
        h.c.restart(h.b)
        h.c.settle()
        outcome = h.run()
        self.assertEqual('error', outcome.status)
        self.assertEqual([], h.c.violations)

    # HIGH (leak, silent loss), new with this change.  Sequence: node A
    # lost while the volume hydrates on node B (100 of 8192 regions
    # copied).  The operator runs abandon-source: it records the move
    # 'source_lost' and builds the clone over the stand-in, then stops
    # before the scan's record (ScanRaced: the instance keeps writing;
    # or ScanInconsistent, or a crash).  Node B reboots, and the
    # clone's metadata LV is lost (its device failed, or removed by
    # hand -- the case operations.rst "The destination's metadata LV is
    # lost" covers).  The rerun skips every check for a move already
    # 'source_lost' (lost_source.py:243-244), takes "data LV, no
    # metadata LV" for "zeroed, step 8 done" (lost_source.py:307
    # skipped, 328), maps
    # the partly copied LV linearly, unzeroed, and _outcome finds no
    # loss recorded at all (no file, no keys: _saved_from_record gives
    # 'lost_regions' 0, lost_source.py:552) -- so since this change the
    # volume keeps its usable status (lost_source.py:334) and the
    # move is cleared: 8092 regions never copied are served from the
    # thick LV's old extents (another tenant's data) as the volume, and
    # nothing records that anything was lost.  (Before, the volume was
    # at least set to 'error'.)  The decision to keep the status rests
    # on the absence of a record, not on a record of this move saying
    # 0; with an earlier abandon's keys/file in place (same path
    # lost-<id>.json) it rests on that earlier abandon's count.
    # (Fixed: without this move's scan recorded, refused.)
    def test_a_rerun_without_its_metadata_never_keeps_it_usable(self):
        h = self.cut_short()
        h.c.restart(h.b)
        h.c.settle()
        del h.b.vg.lvs[cl.META]             # its device failed
        rec = dict(h.c.db.volumes[cl.VOLUME_ID])
        exc = self.assertRaises(tls.lost_source.Refused, h.run)
        self.assertIn('no scan of this move was recorded', str(exc))
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.assertEqual(rec, h.c.db.volumes[cl.VOLUME_ID])
        self.assertNotIn('dmclone_lost_regions',
                         h.c.db.admin_metadata[cl.VOLUME_ID])
        self.assertNotIn(cl.HANDLE, h.b.dm.devices)
        self.assertIn(cl.LV, h.b.vg.lvs)
        self.assertEqual([], h.c.violations)

    def test_an_earlier_abandons_record_is_not_this_moves(self):
        # The loss file of an earlier abandon of the volume (same path)
        # names another move: refused all the same.
        h = self.cut_short()
        lost_source.write_json(
            lost_source.loss_file(h.state_dir, cl.VOLUME_ID),
            {'volume_id': cl.VOLUME_ID, 'move': 'an earlier move',
             'uncopied_regions': 0, 'ranges': []})
        h.c.restart(h.b)
        h.c.settle()
        del h.b.vg.lvs[cl.META]
        self.assertRaises(tls.lost_source.Refused, h.run)
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
