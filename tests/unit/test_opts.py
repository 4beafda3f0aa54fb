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

"""Options: help texts, bounds and the generator entry point."""

import ddt
from oslo_config import cfg
from oslo_config import fixture as config_fixture

from cinder.tests.unit import test

from cinder_dmclone import opts


@ddt.ddt
class OptsTestCase(test.TestCase):

    def test_list_opts(self):
        [(group, options)] = opts.list_opts()
        self.assertEqual('backend_defaults', group)
        names = {o.name for o in options}
        for name in ('dmclone_metadata_volume_group', 'dmclone_region_size',
                     'dmclone_hydration_threshold',
                     'dmclone_hydration_batch_size',
                     'dmclone_monitor_interval', 'dmclone_transfer_timeout',
                     'dmclone_metadata_reserve', 'dmclone_node_name',
                     'dmclone_node_aliases', 'dmclone_thin_map'):
            self.assertIn(name, names)
        for option in options:
            self.assertGreater(len(option.help or ""), 20, option.name)

    def test_list_opts_returns_copies(self):
        [(_group, options)] = opts.list_opts()
        self.assertIsNot(options[0], opts.dmclone_opts[0])

    @ddt.data(('dmclone_region_size', 2), ('dmclone_region_size', 2 ** 21),
              ('dmclone_hydration_threshold', 0),
              ('dmclone_hydration_batch_size', -1),
              ('dmclone_monitor_interval', 0),
              ('dmclone_transfer_timeout', 5))
    @ddt.unpack
    def test_bounds(self, name, value):
        conf = cfg.ConfigOpts()
        fixture = self.useFixture(config_fixture.Config(conf))
        conf.register_opts(opts.dmclone_opts, group='b')
        self.assertRaises(ValueError, fixture.config, group='b',
                          **{name: value})

    def test_defaults_are_integers(self):
        for option in opts.dmclone_opts:
            if isinstance(option, cfg.IntOpt):
                self.assertIsInstance(option.default, int, option.name)

    def test_thin_map_is_off_until_proven(self):
        [option] = [o for o in opts.dmclone_opts
                    if o.name == 'dmclone_thin_map']
        self.assertIs(False, option.default)
