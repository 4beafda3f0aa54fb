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

"""The node-local marks of thin-mapped clones (map_mark)."""

import os
from unittest import mock

import ddt
import fixtures

from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import test

from cinder_dmclone import map_mark
from cinder_dmclone import move

TAG = move.thin_map_tag('ab' * 16)


@ddt.ddt
class MarkPathTestCase(test.TestCase):
    """Where a mark lives: pure."""

    def test_under_the_state_dir(self):
        self.assertEqual('/var/lib/cinder/dmclone/thin-mapped/node-a',
                         map_mark.marks_dir('/var/lib/cinder/dmclone',
                                            'node-a'))
        for bad in ('', '.', '..', 'a/b', None):
            self.assertRaises(map_mark.MarkNameInvalid, map_mark.marks_dir,
                              '/var/lib/cinder/dmclone', bad)
        self.assertEqual('/var/lib/cinder/dmclone/ending/node-a',
                         map_mark.marks_dir('/var/lib/cinder/dmclone',
                                            'node-a', map_mark.ENDING))
        self.assertEqual('/d/%s' % fake.VOLUME_ID,
                         map_mark.mark_path('/d', fake.VOLUME_ID))

    @ddt.data('', '.', '..', '../x', 'a/b', 'a.tmp', '-a', 'a b', None, 7,
              'x' * 200)
    def test_a_bad_volume_id_names_no_file(self, volume_id):
        self.assertRaises(map_mark.MarkNameInvalid, map_mark.mark_path,
                          '/d', volume_id)

    def test_same_tag(self):
        self.assertTrue(map_mark.same_tag(TAG, TAG))
        self.assertFalse(map_mark.same_tag(TAG[:-1] + 'x', TAG))
        self.assertFalse(map_mark.same_tag(None, TAG))
        self.assertFalse(map_mark.same_tag('', ''))


class MapMarksTestCase(test.TestCase):
    """Durable write, read and removal, in a temporary directory."""

    def setUp(self):
        super().setUp()
        self.state_dir = self.useFixture(fixtures.TempDir()).path
        self.marks = map_mark.MapMarks(os.path.join(
            self.state_dir, 'dmclone', 'thin-mapped'))

    def test_no_mark(self):
        self.assertIsNone(self.marks.read(fake.VOLUME_ID))
        self.assertFalse(self.marks.remove(fake.VOLUME_ID))

    def test_write_read_remove(self):
        self.marks.write(fake.VOLUME_ID, TAG)
        self.assertEqual(TAG, self.marks.read(fake.VOLUME_ID))
        self.assertEqual([fake.VOLUME_ID],
                         os.listdir(self.marks.directory))
        mode = os.stat(self.marks.directory).st_mode & 0o777
        self.assertEqual(0o700, mode)
        self.marks.write(fake.VOLUME_ID, TAG[::-1])
        self.assertEqual(TAG[::-1], self.marks.read(fake.VOLUME_ID))
        self.assertTrue(self.marks.remove(fake.VOLUME_ID))
        self.assertIsNone(self.marks.read(fake.VOLUME_ID))

    def test_volume_ids_lists_only_marks(self):
        self.assertEqual([], self.marks.volume_ids())
        self.marks.write(fake.VOLUME2_ID, TAG)
        self.marks.write(fake.VOLUME_ID, TAG)
        # (A write cut short leaves its temporary file.)
        open(self.marks.path(fake.VOLUME3_ID) + '.tmp', 'w').close()
        self.assertEqual(sorted([fake.VOLUME_ID, fake.VOLUME2_ID]),
                         self.marks.volume_ids())

    def test_durable_before_it_returns(self):
        # The file's data, then (after the rename) its directory.
        synced = []
        real = os.fsync

        def fsync(fd):
            synced.append(os.readlink('/proc/self/fd/%d' % fd))
            return real(fd)
        replace = os.replace

        def replacing(src, dst):
            synced.append('rename')
            return replace(src, dst)
        self.mock_object(os, 'fsync', side_effect=fsync)
        self.mock_object(os, 'replace', side_effect=replacing)
        self.marks.write(fake.VOLUME_ID, TAG)
        path = self.marks.path(fake.VOLUME_ID)
        self.assertEqual([path + '.tmp', 'rename', self.marks.directory],
                         synced[-3:])

    def test_a_failed_write_raises_and_leaves_no_mark(self):
        self.mock_object(os, 'fsync', side_effect=OSError(5, 'EIO'))
        self.assertRaises(OSError, self.marks.write, fake.VOLUME_ID, TAG)
        self.assertIsNone(self.marks.read(fake.VOLUME_ID))

    def test_an_unreadable_mark_raises(self):
        self.marks.write(fake.VOLUME_ID, TAG)
        with mock.patch('builtins.open', side_effect=PermissionError(13)):
            self.assertRaises(OSError, self.marks.read, fake.VOLUME_ID)
