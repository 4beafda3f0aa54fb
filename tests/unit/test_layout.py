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

"""Name scheme and metadata sizing."""

import ddt
from oslo_utils import units

from cinder.tests.unit import test

from cinder_dmclone import exception
from cinder_dmclone import layout

LV = 'volume-6b4b9e1c-5c1e-4b5c-9c55-2f0c1d1d2e3f'


@ddt.ddt
class NamesTestCase(test.TestCase):

    def test_handle(self):
        self.assertEqual('dmclone-cinder--volumes-' + LV,
                         layout.handle_name('cinder-volumes', LV))
        self.assertEqual('/dev/mapper/dmclone-vg-' + LV,
                         layout.handle_path('vg', LV))
        self.assertEqual('DMCLONE-dmclone-vg-' + LV,
                         layout.handle_uuid('vg', LV))
        self.assertEqual(('cinder-volumes', LV), layout.parse_handle(
            'dmclone-cinder--volumes-' + LV))
        self.assertEqual(LV, layout.lv_name_from_handle(
            'dmclone-cinder--volumes-' + LV, 'cinder-volumes'))

    def test_handle_of_another_volume_group(self):
        self.assertIsNone(layout.lv_name_from_handle(
            'dmclone-dmc--a-' + LV, 'dmc-b'))

    @ddt.data('cinder--volumes-volume--x', 'dmclone-', 'dmclone-vg-a b',
              'dmclone-vg', 'dmclone-vg-', 'dmclone--vg', 'other',
              'dmclone-..-x')
    def test_not_a_handle(self, name):
        self.assertIsNone(layout.parse_handle(name))

    @ddt.data(None, '', 'a/b', '..')
    def test_invalid_vg(self, vg):
        self.assertRaises(exception.InvalidDMName, layout.handle_name, vg,
                          LV)

    def test_metadata(self):
        self.assertEqual(LV + '-dmcmeta', layout.metadata_lv_name(LV))
        self.assertEqual(LV, layout.lv_name_from_metadata_lv(
            LV + '-dmcmeta'))
        self.assertIsNone(layout.lv_name_from_metadata_lv(LV))
        self.assertIsNone(layout.lv_name_from_metadata_lv('-dmcmeta'))

    @ddt.data('', '.', '..', 'a/b', 'a b', 'snapshot-x', 'pvmove0',
              '-x', None, 'x' * 102, '$(id)')
    def test_invalid_lv_names(self, name):
        self.assertRaises(exception.InvalidDMName,
                          layout.validate_lv_name, name)

    @ddt.data(LV, '_snapshot-x', 'legacy.lv+1')
    def test_valid_lv_names(self, name):
        self.assertEqual(name, layout.validate_lv_name(name))

    def test_lv_device(self):
        self.assertEqual('/dev/vg/' + LV, layout.lv_device('vg', LV))

    @ddt.data(('10.0.0.1:3260,1 iqn.x:1 0', '10.0.0.1:3260'),
              ('10.0.0.1:3260;10.0.1.1:3260,1 iqn.x:1 0', '10.0.0.1:3260'),
              ('[fd00::1]:3260;10.0.1.1:3260,1 iqn.x:1 0',
               '[fd00::1]:3260'),
              ('', ''), (None, ''))
    @ddt.unpack
    def test_export_portal(self, location, portal):
        # (The primary portal, with or without secondary ones after it.)
        self.assertEqual(portal, layout.export_portal(location))

    @ddt.data(('10.0.0.1:3260;10.0.1.1:3260,1 iqn.x:1 0', 'iqn.x:1'),
              ('10.0.0.1:3260,1', None), (None, None))
    @ddt.unpack
    def test_export_iqn(self, location, iqn):
        self.assertEqual(iqn, layout.export_iqn(location))


@ddt.ddt
class SizesTestCase(test.TestCase):

    @ddt.data((4, 8), (64, 128), (1024 * 1024, 2097152))
    @ddt.unpack
    def test_region_sectors(self, kb, sectors):
        self.assertEqual(sectors, layout.region_sectors(kb))

    @ddt.data(2, 48, 100, 2 * 1024 * 1024)
    def test_region_sectors_invalid(self, kb):
        self.assertRaises(exception.InvalidTable, layout.region_sectors, kb)

    def test_metadata_minimum(self):
        self.assertEqual(8 * units.Mi,
                         layout.metadata_size_bytes(units.Gi, 64 * units.Ki))

    def test_metadata_follows_volume_size(self):
        # 1 TiB at 4 KiB regions: 2^28 regions, a 32 MiB bitmap.
        size = layout.metadata_size_bytes(units.Ti, 4 * units.Ki,
                                          reserve=1.0)
        self.assertEqual(32 * units.Mi, size)
        self.assertEqual(64 * units.Mi,
                         layout.metadata_size_bytes(units.Ti, 4 * units.Ki))

    def test_metadata_rounded_to_mib(self):
        size = layout.metadata_size_bytes(10 * units.Ti + 1, 4 * units.Ki)
        self.assertEqual(0, size % units.Mi)
        self.assertGreaterEqual(size, 2 * 320 * units.Mi)

    @ddt.data((0, 4096), (4096, 0), (-1, 4096))
    @ddt.unpack
    def test_metadata_invalid(self, volume, region):
        self.assertRaises(exception.InvalidTable,
                          layout.metadata_size_bytes, volume, region)
