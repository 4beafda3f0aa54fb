# Copyright 2026 The cinder-dmclone authors.
#
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

"""Review 15: the node's thin-mapped marks and one record key per move."""

import dataclasses

from cinder_dmclone import map_mark
from cinder_dmclone import move
from tests.unit import test_review11

OLD_KEY = move.KEY_PREFIX + move.THIN_MAPPED


class UpgradeMidMoveTestCase(test_review11.ThinMapClusterTestCase):
    """R15-1: a move mapped by the previous release has no node mark.

    Release 1.x marked a mapped clone under the single record key
    ``dmclone_thin_mapped`` and wrote no file on the destination's node.
    The new release honours that key on load, but only for as long as
    the record keeps it: ``was_mapped`` returns at once on the record's
    mark, neither remembering it (``Destination.mapped``) nor writing
    the node's own mark.  A stale whole-dict save of the volume's admin
    metadata (the owner's legacy ``os-attach``: R14-1) then drops the
    key, and the clone, whose regions were discarded, hydrates in a
    pool that does not zero: regions copied into new chunks leave the
    pool's old data, another volume's, in regions never copied.
    """

    def tag(self):
        return move.thin_map_tag(self.c.transfer().secret)

    def mapped_by_the_old_release(self):
        """A mapped move as release 1.x left it, then the upgrade."""
        self.assertTrue(self.c.migrate(self.b))
        tag = self.tag()
        secret = self.c.transfer().secret
        self.c.db.volume_admin_metadata_delete(
            self.c.ctxt, self.c.volume_id, move.thin_mapped_key(secret))
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, self.c.volume_id, {OLD_KEY: tag}, False)
        self.b.marks.remove(self.c.volume_id)
        # The upgrade: node-b's service starts with the new release.
        self.b.restart()
        self.b.recover()
        self.assertTrue(self.c.transfer().thin_mapped)
        self.b.monitor.tick()

    def stale_save(self):
        """Cinder's Volume.save writes the admin metadata whole, stale."""
        md = dict(self.c.db.volume_admin_metadata_get(
            self.c.ctxt, self.c.volume_id))
        md.pop(OLD_KEY)
        md['attached_mode'] = 'rw'
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, self.c.volume_id, md, True)
        self.assertFalse(self.c.transfer().thin_mapped)

    def test_the_running_service_keeps_the_guard(self):
        self.mapped_by_the_old_release()
        self.stale_save()
        self.assert_guarded_then_completed(
            'R15-1: a clone mapped before the upgrade hydrates in a pool '
            'that does not zero once a stale save dropped the old key')
        self.assertIsNone(self.b.marks.read(self.c.volume_id))

    def test_a_restart_keeps_the_guard(self):
        self.mapped_by_the_old_release()
        self.stale_save()
        self.assert_guarded_then_completed(
            'R15-1: after a restart a clone mapped before the upgrade '
            'hydrates in a pool that does not zero', restart=True)
        self.assertIsNone(self.b.marks.read(self.c.volume_id))

    def test_the_old_key_guards_while_it_stays(self):
        # (The upgrade itself keeps the guard: the defect needs the save.)
        self.mapped_by_the_old_release()
        self.assert_guarded_then_completed()


class SharedStateDirTestCase(test_review11.ThinMapClusterTestCase):
    """R15-2: two node services of one host share ``<state_path>``.

    The held-snapshot records of region_map are named after the node
    (``ThinMaps._record_path``: "two volume services of one host may
    share a record directory and a volume group under two node names"),
    the thin-mapped marks are not: ``<state_path>/dmclone/thin-mapped/
    <volume id>``, removed by ``drop_node_mark`` whatever move or node
    wrote it.  So a teardown on one node service of a move given up
    (``_refuse_if_given_up`` after a build that outlasted the source's
    timeout, a late ``abort``, ``drop_stale_prepare``) removes the mark
    of the next move of the volume, mapped by the other node service;
    a stale save then drops the record's mark, and a restart of that
    service lets the clone hydrate in a pool that does not zero.
    Here node-a stands for the service whose move was given up (with
    three nodes: a move a->c given up late on c, the next a->b).
    """

    def test_another_nodes_teardown_keeps_the_mark(self):
        # Fixed: the marks' directory is named after the node, as the
        # held-snapshot records are.  Node-a's service shares node-b's
        # state directory.
        self.a.marks.directory = map_mark.marks_dir(
            self.b.state_dir, self.a.name)
        self.assertTrue(self.c.migrate(self.b))
        mine = move.thin_map_tag(self.c.transfer().secret)
        self.assertEqual(mine, self.b.marks.read(self.c.volume_id))
        given_up = dataclasses.replace(
            self.c.transfer(), secret='cd' * 16, state=move.PREPARING,
            dest_node='node-a', dest_host=self.c.transfer().source_host)
        self.mock_object(self.a.destination.clones, 'tear_down')
        # (node-a stands for a third node here: its own mark of the move
        # it is the source of would keep this teardown from running.)
        self.a.destination.evidence = None
        self.a.destination.tear_down(
            {'id': self.c.volume_id, 'provider_auth': None}, given_up)
        self.assertEqual(mine, self.b.marks.read(self.c.volume_id),
                         'R15-2: node-a removed the mark node-b wrote')
