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

"""The pure layer, dmsetup.py: validation, table builders, parsers.

The commands that use it are tested in test_privileged.py.
"""

import ddt

from cinder.tests.unit import test

from cinder_dmclone import dmsetup
from cinder_dmclone import exception

# Real output seen from the 6.1 kernel (64 KiB regions, 256 MiB volume).
CREATED = ('8 6/2048 128 0/4096 0 1 no_hydration 4 hydration_threshold 1 '
           'hydration_batch_size 1 rw')
HYDRATED = ('8 6/2048 128 4096/4096 0 0 4 hydration_threshold 1 '
            'hydration_batch_size 1 rw')
HYDRATING = ('8 7/2048 128 1000/4096 64 0 4 hydration_threshold 64 '
             'hydration_batch_size 16 rw')


@ddt.ddt
class ValidationTestCase(test.TestCase):

    @ddt.data('dmclone-volume-6b4b9e1c-5c1e-4b5c-9c55-2f0c1d1d2e3f',
              'a', 'A.b+c_d-e', '0' * 127)
    def test_valid_names(self, name):
        self.assertEqual(name, dmsetup.validate_name(name))

    @ddt.data('', '-leading-dash', 'has space', 'slash/inside', 'semi;colon',
              '$(reboot)', '0' * 128, None, 5, 'new\nline', '..',
              'trailing-newline\n')
    def test_invalid_names(self, name):
        self.assertRaises(exception.InvalidDMName,
                          dmsetup.validate_name, name)

    @ddt.data('/dev/vg/lv', '/dev/mapper/dmclone-x', '/dev/sda', '253:4',
              '/dev/disk/by-path/ip-10.0.0.1:3260-iscsi-iqn.x:y-lun-0')
    def test_valid_devices(self, dev):
        self.assertEqual(dev, dmsetup.validate_device(dev))

    @ddt.data('vg/lv', '/dev/../etc/passwd', '/dev/vg/..', '/dev/a b',
              '253:', ':4', '', None, '/etc/passwd', '/dev/x;y',
              '/dev/sdb\n')
    def test_invalid_devices(self, dev):
        self.assertRaises(exception.InvalidDMName,
                          dmsetup.validate_device, dev)

    @ddt.data(8, 16, 128, 2048, 2097152)
    def test_valid_region_sizes(self, size):
        self.assertEqual(size, dmsetup.validate_region_size(size))

    @ddt.data(0, 4, 7, 12, 100, 2097153, 4194304, -8, True, '128', 128.0)
    def test_invalid_region_sizes(self, size):
        self.assertRaises(exception.InvalidTable,
                          dmsetup.validate_region_size, size)

    def test_valid_messages(self):
        self.assertEqual(['enable_hydration'],
                         dmsetup.validate_message('enable_hydration'))
        self.assertEqual(['hydration_batch_size', '16'],
                         dmsetup.validate_message('hydration_batch_size', 16))

    @ddt.data((), ('reboot',), ('hydration_threshold', '1; rm'),
              ('hydration_threshold', '-1'), ('Enable_hydration',),
              ('enable_hydration', 'x y'))
    def test_invalid_messages(self, words):
        self.assertRaises(exception.InvalidDMName,
                          dmsetup.validate_message, *words)

    @ddt.data('clone', 'linear', 'thin_pool')
    def test_valid_target_types(self, target):
        self.assertEqual(target, dmsetup.validate_target_type(target))

    @ddt.data('a b', '', '--target', 'Clone', None, 1)
    def test_invalid_target_types(self, target):
        self.assertRaises(exception.InvalidDMName,
                          dmsetup.validate_target_type, target)


@ddt.ddt
class TableTestCase(test.TestCase):

    def test_linear(self):
        seg = dmsetup.linear_segment(0, 2048, '/dev/vg/lv')
        self.assertEqual('0 2048 linear /dev/vg/lv 0', str(seg))
        self.assertEqual(2048, seg.end)

    def test_linear_with_offset(self):
        seg = dmsetup.linear_segment(100, 50, '253:1', 100)
        self.assertEqual('100 50 linear 253:1 100', str(seg))

    @ddt.data((0, 0, 0), (-1, 10, 0), (0, 10, -1), (0, True, 0),
              (0, 1.5, 0), ('0', 10, 0))
    @ddt.unpack
    def test_linear_bad_numbers(self, start, length, offset):
        self.assertRaises(exception.InvalidTable, dmsetup.linear_segment,
                          start, length, '/dev/vg/lv', offset)

    def test_clone_defaults_no_hydration(self):
        seg = dmsetup.clone_segment(0, 524288, '/dev/m/meta', '/dev/d/dest',
                                    '/dev/sdb', 128)
        self.assertEqual('0 524288 clone /dev/m/meta /dev/d/dest /dev/sdb '
                         '128 1 no_hydration', str(seg))

    def test_clone_hydrating_no_features(self):
        seg = dmsetup.clone_segment(0, 1024, '/dev/m', '/dev/d', '/dev/s',
                                    8, hydration=True)
        self.assertEqual('0 1024 clone /dev/m /dev/d /dev/s 8', str(seg))

    def test_clone_all_options_are_ints(self):
        seg = dmsetup.clone_segment(0, 1024, '/dev/m', '/dev/d', '/dev/s',
                                    128, hydration=False,
                                    discard_passdown=False,
                                    hydration_threshold=64,
                                    hydration_batch_size=16)
        self.assertEqual(
            '0 1024 clone /dev/m /dev/d /dev/s 128 2 no_hydration '
            'no_discard_passdown 4 hydration_threshold 64 '
            'hydration_batch_size 16', str(seg))

    def test_clone_core_args_without_features(self):
        seg = dmsetup.clone_segment(0, 1024, '/dev/m', '/dev/d', '/dev/s',
                                    128, hydration=True,
                                    hydration_batch_size=4)
        self.assertEqual('0 1024 clone /dev/m /dev/d /dev/s 128 0 2 '
                         'hydration_batch_size 4', str(seg))

    @ddt.data({'hydration_threshold': 0}, {'hydration_batch_size': -1},
              {'hydration_threshold': '64'}, {'hydration_batch_size': 1.0},
              {'region_size': 100}, {'dest_dev': 'relative'})
    def test_clone_rejects(self, kwargs):
        args = dict(start=0, length=1024, metadata_dev='/dev/m',
                    dest_dev='/dev/d', source_dev='/dev/s', region_size=128)
        args.update(kwargs)
        self.assertRaises((exception.InvalidTable, exception.InvalidDMName),
                          dmsetup.clone_segment, **args)

    def test_format_multi_segment(self):
        table = dmsetup.format_table([
            dmsetup.clone_segment(0, 1024, '/dev/m', '/dev/d', '/dev/s', 8),
            dmsetup.linear_segment(1024, 1024, '/dev/d', 1024)])
        self.assertEqual('0 1024 clone /dev/m /dev/d /dev/s 8 1 no_hydration'
                         '\n1024 1024 linear /dev/d 1024', table)

    def test_format_rejects_gap(self):
        self.assertRaises(exception.InvalidTable, dmsetup.format_table, [
            dmsetup.linear_segment(0, 10, '/dev/d'),
            dmsetup.linear_segment(11, 10, '/dev/d', 11)])

    def test_format_rejects_not_from_zero(self):
        self.assertRaises(exception.InvalidTable, dmsetup.format_table,
                          [dmsetup.linear_segment(5, 10, '/dev/d')])

    def test_format_rejects_empty(self):
        self.assertRaises(exception.InvalidTable, dmsetup.format_table, [])

    def test_table_length(self):
        self.assertEqual(30, dmsetup.table_length([
            dmsetup.linear_segment(0, 10, '/dev/d'),
            dmsetup.linear_segment(10, 20, '/dev/e')]))

    def test_parse_table_round_trip(self):
        text = ('0 1024 clone 253:3 253:2 8:16 128 1 no_hydration 4 '
                'hydration_threshold 64 hydration_batch_size 16\n'
                '1024 2048 linear 253:2 1024\n')
        segs = dmsetup.parse_table(text)
        self.assertEqual(2, len(segs))
        self.assertEqual(text.strip(), dmsetup.format_table(segs))
        clone = dmsetup.parse_clone_table(segs[0])
        self.assertEqual(('253:3', '253:2', '8:16', 128),
                         (clone.metadata_dev, clone.dest_dev,
                          clone.source_dev, clone.region_size))
        self.assertEqual(('no_hydration',), clone.features)
        self.assertEqual({'hydration_threshold': 64,
                          'hydration_batch_size': 16}, clone.core_args)

    def test_parse_clone_table_minimal(self):
        seg = dmsetup.parse_table('0 8 clone 1:1 1:2 1:3 8')[0]
        clone = dmsetup.parse_clone_table(seg)
        self.assertEqual((), clone.features)
        self.assertEqual({}, clone.core_args)

    @ddt.data('0 8 linear 1:1 0', '0 8 clone 1:1 1:2 1:3',
              '0 8 clone 1:1 1:2 1:3 8 2 no_hydration',
              '0 8 clone 1:1 1:2 1:3 8 0 3 a 1 b',
              '0 8 clone 1:1 1:2 1:3 8 0 2 hydration_threshold x',
              '0 8 clone 1:1 1:2 1:3 8 0 0 extra',
              '0 8 clone 1:1 1:2 1:3 big')
    def test_parse_clone_table_malformed(self, line):
        seg = dmsetup.parse_table(line)[0]
        self.assertRaises(exception.DMStatusParseError,
                          dmsetup.parse_clone_table, seg)

    @ddt.data('0 clone', 'x 8 linear', '0 -8 linear 1:1 0')
    def test_parse_table_malformed(self, text):
        self.assertRaises(exception.DMStatusParseError,
                          dmsetup.parse_table, text)


@ddt.ddt
class StatusTestCase(test.TestCase):

    def test_created(self):
        st = dmsetup.parse_clone_status(CREATED)
        self.assertEqual(8, st.metadata_block_size)
        self.assertEqual((6, 2048), (st.metadata_used, st.metadata_total))
        self.assertEqual(128, st.region_size)
        self.assertEqual((0, 4096), (st.hydrated_regions, st.total_regions))
        self.assertEqual(0, st.hydrating_regions)
        self.assertEqual(('no_hydration',), st.features)
        self.assertFalse(st.hydration_enabled)
        self.assertEqual(1, st.hydration_threshold)
        self.assertEqual(1, st.hydration_batch_size)
        self.assertFalse(st.read_only)
        self.assertFalse(st.fully_hydrated)
        self.assertFalse(st.failed)
        self.assertEqual(0.0, st.progress)

    def test_hydrating(self):
        st = dmsetup.parse_clone_status(HYDRATING)
        self.assertTrue(st.hydration_enabled)
        self.assertEqual(64, st.hydrating_regions)
        self.assertEqual(64, st.hydration_threshold)
        self.assertEqual(16, st.hydration_batch_size)
        self.assertAlmostEqual(1000 / 4096, st.progress)

    def test_hydrated(self):
        st = dmsetup.parse_clone_status(HYDRATED)
        self.assertTrue(st.fully_hydrated)
        self.assertEqual(1.0, st.progress)

    def test_read_only_and_both_features(self):
        st = dmsetup.parse_clone_status(
            '8 6/2048 128 0/4096 0 2 no_hydration no_discard_passdown 4 '
            'hydration_threshold 1 hydration_batch_size 1 ro')
        self.assertTrue(st.read_only)
        self.assertEqual(('no_hydration', 'no_discard_passdown'),
                         st.features)

    def test_zero_regions_progress(self):
        st = dmsetup.parse_clone_status('8 6/2048 128 0/0 0 0 0 rw')
        self.assertEqual(1.0, st.progress)
        self.assertEqual({}, st.core_args)
        self.assertIsNone(st.hydration_threshold)

    @ddt.data('Fail', 'Error', ' Fail ')
    def test_failed_forms(self, params):
        st = dmsetup.parse_clone_status(params)
        self.assertTrue(st.failed)
        self.assertFalse(st.fully_hydrated)
        self.assertEqual(params.strip(), st.state)

    def test_fail_after_fields(self):
        st = dmsetup.parse_clone_status(
            '8 6/2048 128 0/4096 0 0 4 hydration_threshold 1 '
            'hydration_batch_size 1 Fail')
        self.assertTrue(st.failed)

    @ddt.data(
        '',                                                  # empty
        'Failed',                                            # unknown word
        '8 6/2048 128 0/4096 0 0 0',                         # no rw/ro
        '8 6/2048 128 0/4096 0 0 0 rx',                      # bad mode
        '8 6/2048 128 0/4096 0 0 0 rw extra',                # trailing
        'x 6/2048 128 0/4096 0 0 0 rw',                      # bad int
        '8 6-2048 128 0/4096 0 0 0 rw',                      # bad fraction
        '8 6/2048 128 5000/4096 0 0 0 rw',                   # > total
        '8 6/2048 128 0/4096 -1 0 0 rw',                     # negative
        '8 6/2048 128 0/4096 0 2 no_hydration 0 rw',         # short feats
        '8 6/2048 128 0/4096 0 1 bogus_feature 0 rw',        # unknown feat
        '8 6/2048 128 0/4096 0 0 3 a 1 b rw',                # odd core args
        '8 6/2048 128 0/4096 0 0 2 hydration_threshold x rw',  # non-int
        '8 6/2048 128 0/4096 0 0 x rw',                      # bad count
        '8 6/2048 128 0/4096 0 1',                           # truncated
    )
    def test_malformed(self, params):
        self.assertRaises(exception.DMStatusParseError,
                          dmsetup.parse_clone_status, params)

    def test_parse_status_multi_segment(self):
        lines = dmsetup.parse_status('0 524288 clone %s\n'
                                     '524288 1024 linear \n' % CREATED)
        self.assertEqual(['clone', 'linear'], [s.target for s in lines])
        self.assertEqual(0, lines[0].clone.hydrated_regions)
        self.assertIsNone(lines[1].clone)
        self.assertEqual('', lines[1].params)

    def test_parse_status_all(self):
        text = ('dmclone-volume-a: 0 524288 clone %s\n'
                'dmclone-volume-b: 0 524288 clone %s\n'
                'dmclone-volume-b: 524288 100 linear \n' % (CREATED, HYDRATED))
        result = dmsetup.parse_status_all(text)
        self.assertEqual({'dmclone-volume-a', 'dmclone-volume-b'},
                         set(result))
        self.assertEqual(2, len(result['dmclone-volume-b']))
        self.assertTrue(result['dmclone-volume-b'][0].clone.fully_hydrated)

    @ddt.data('No devices found\n', '', '\n\n')
    def test_parse_status_all_empty(self, text):
        self.assertEqual({}, dmsetup.parse_status_all(text))

    @ddt.data('0 8 linear', 'name 0 8 linear', 'name: x 8 linear')
    def test_parse_status_all_malformed(self, text):
        self.assertRaises(exception.DMStatusParseError,
                          dmsetup.parse_status_all, text)

    def test_parse_status_all_name_with_colon(self):
        # dmsetup mangles white space in names, not ':'
        text = ('odd:name: 0 8 linear \n'
                'dmclone-vg-a: 0 524288 clone %s\n' % HYDRATED)
        result = dmsetup.parse_status_all(text)
        self.assertEqual(['dmclone-vg-a', 'odd:name'], sorted(result))
        self.assertEqual('linear', result['odd:name'][0].target)

    def test_parse_status_all_bad_line_costs_only_its_device(self):
        bad = 'dmclone-vg-b: 0 524288 clone %s' % CREATED.replace(
            'no_hydration', 'new_feature')
        text = '\n'.join([
            'dmclone-vg-a: 0 524288 clone %s' % HYDRATED, bad,
            'dmclone-vg-b: 524288 8 linear ',
            'no name here',
            'dmclone-vg-c: 0 524288 clone %s' % CREATED]) + '\n'
        errors = {}
        result = dmsetup.parse_status_all(text, errors=errors)
        self.assertEqual(['dmclone-vg-a', 'dmclone-vg-c'], sorted(result))
        self.assertEqual({'dmclone-vg-b', None}, set(errors))
        self.assertIn(bad, str(errors['dmclone-vg-b']))
        self.assertIn('new_feature', str(errors['dmclone-vg-b']))
        self.assertIn('no name here', str(errors[None]))
        # without ``errors`` the whole text is refused, as before
        self.assertRaises(exception.DMStatusParseError,
                          dmsetup.parse_status_all, text)

    def test_parse_table_all_bad_line_costs_only_its_device(self):
        text = ('h:1: 0 2048 clone 253:3 253:2 8:16 128\n'
                'h2: 0 x linear 253:4 0\n'
                'h3: 0 8 linear 253:4 0\n')
        errors = {}
        result = dmsetup.parse_table_all(text, errors=errors)
        self.assertEqual(['h3', 'h:1'], sorted(result))
        self.assertEqual(['h2'], list(errors))

    def test_parse_targets(self):
        self.assertEqual({'clone': 'v1.0.0', 'linear': 'v1.4.0'},
                         dmsetup.parse_targets(
                             'clone            v1.0.0\n'
                             'linear           v1.4.0\n\n'))

    def test_device_path(self):
        self.assertEqual('/dev/mapper/dmclone-x', dmsetup.device_path(
            'dmclone-x'))
        self.assertRaises(exception.InvalidDMName, dmsetup.device_path,
                          '../x')

    def test_table_all_rejects_garbage(self):
        self.assertRaises(exception.DMStatusParseError,
                          dmsetup.parse_table_all, 'no colon here')

    INFO = ('Name:              dmclone-dmc--a-volume-1\n'
            'State:             ACTIVE\n'
            'Read Ahead:        256\n'
            'Tables present:    LIVE\n'
            'Open count:        2\n'
            'Event number:      0\n'
            'Major, minor:      254, 3\n'
            'Number of targets: 1\n'
            'UUID: DMCLONE-dmclone-dmc--a-volume-1\n')

    def test_parse_open_count(self):
        self.assertEqual(2, dmsetup.parse_open_count(self.INFO))
        self.assertEqual(0, dmsetup.parse_open_count(
            self.INFO.replace('Open count:        2', 'Open count: 0')))

    def test_parse_open_count_garbage(self):
        for text in ('', 'Device does not exist.\n',
                     self.INFO.replace('count:        2', 'count: many'),
                     self.INFO.replace('count:        2', 'count: -1')):
            self.assertRaises(exception.DMStatusParseError,
                              dmsetup.parse_open_count, text)

    def test_parse_sectors(self):
        self.assertEqual(2097152, dmsetup.parse_sectors('2097152\n'))
        for text in ('lots\n', '', '-8\n', '8 8\n'):
            self.assertRaises(exception.DMStatusParseError,
                              dmsetup.parse_sectors, text)


class UncopiedTestCase(test.TestCase):
    """The regions a clone never copied, their ranges and fencing."""

    def test_error_segment(self):
        self.assertEqual('8 16 error', str(dmsetup.error_segment(8, 16)))
        self.assertRaises(exception.InvalidTable, dmsetup.error_segment,
                          0, 0)

    def test_region_count_rounds_up(self):
        self.assertEqual(2, dmsetup.region_count(129, 128))
        self.assertEqual(1, dmsetup.region_count(128, 128))
        self.assertRaises(exception.InvalidTable, dmsetup.region_count,
                          128, 100)

    def test_runs(self):
        self.assertEqual([(0, 2), (5, 6), (7, 10)],
                         dmsetup.runs([9, 0, 7, 1, 5, 8, 8], 10))
        self.assertEqual([], dmsetup.runs([], 10))
        self.assertRaises(exception.InvalidTable, dmsetup.runs, [10], 10)
        self.assertRaises(exception.InvalidTable, dmsetup.runs, [-1], 10)

    def test_uncopied_ranges_in_bytes_last_region_short(self):
        # 3 regions of 64 KiB, the last one 32 KiB long
        self.assertEqual([(0, 65536), (131072, 32768)],
                         dmsetup.uncopied_ranges([0, 2], 320, 128))

    def test_fencing_table(self):
        table = dmsetup.fencing_table([1, 2, 5], 8 * 128, 128, '/dev/v/l')
        self.assertEqual(['0 128 linear /dev/v/l 0',
                          '128 256 error',
                          '384 256 linear /dev/v/l 384',
                          '640 128 error',
                          '768 256 linear /dev/v/l 768'],
                         [str(s) for s in table])

    def test_fencing_table_edges(self):
        self.assertEqual(['0 1024 error'], [str(s) for s in (
            dmsetup.fencing_table(range(8), 1024, 128, '/dev/v/l'))])
        self.assertEqual(['0 1024 linear /dev/v/l 0'], [str(s) for s in (
            dmsetup.fencing_table([], 1024, 128, '/dev/v/l'))])
        # an extended LV keeps its tail mapped; the short last region
        self.assertEqual(['0 128 linear /dev/v/l 0', '128 72 error',
                          '200 800 linear /dev/v/l 200'],
                         [str(s) for s in dmsetup.fencing_table(
                             [1], 200, 128, '/dev/v/l', total=1000)])
        self.assertRaises(exception.InvalidTable, dmsetup.fencing_table,
                          [1], 200, 128, '/dev/v/l', total=100)

    def test_size_tokens(self):
        for value, token in ((0, '0'), (512, '512'), (65536, '64K'),
                             (3 << 20, '3M'), (1 << 30, '1G'),
                             ((1 << 30) + 65536, '1048640K'),
                             (2 << 40, '2T')):
            self.assertEqual(token, dmsetup.size_token(value))
            self.assertEqual(value, dmsetup.parse_size_token(token))

    def test_ranges_text(self):
        self.assertEqual('0+8M,12M+1012M', dmsetup.ranges_text(
            [(0, 8 << 20), (12 << 20, 1012 << 20)]))
        self.assertEqual('', dmsetup.ranges_text([]))

    def test_ranges_text_cut_to_a_limit(self):
        ranges = [(i << 20, 64 << 10) for i in range(0, 2000, 2)]
        text = dmsetup.ranges_text(ranges, 255)
        self.assertLessEqual(len(text), 255)
        self.assertGreater(len(text), 230)
        kept = text.split(',')[:-1]
        self.assertEqual(text.split(',')[-1],
                         '...+%d more' % (len(ranges) - len(kept)))
        self.assertEqual(dmsetup.ranges_text(ranges[:len(kept)]),
                         ','.join(kept))
