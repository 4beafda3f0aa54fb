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

"""Sphinx configuration of the cinder-dmclone documentation.

Plain Sphinx (default theme, no network at build time).  The
configuration reference and the sample file are generated from the
options in cinder_dmclone/opts.py by oslo.config's Sphinx extensions.
"""

project = 'cinder-dmclone'
copyright = 'cinder-dmclone developers'

extensions = [
    'oslo_config.sphinxext',
    'oslo_config.sphinxconfiggen',
]

# oslo_config.sphinxconfiggen: writes _static/cinder-dmclone.conf.sample
# at build time (not kept in git), included by the sample page.
config_generator_config_file = [
    ('../../etc/oslo-config-generator/cinder-dmclone.conf',
     '_static/cinder-dmclone'),
]

source_suffix = {'.rst': 'restructuredtext'}
master_doc = 'index'
exclude_patterns = []
pygments_style = 'sphinx'
html_theme = 'alabaster'
html_static_path = ['_static']
html_title = 'cinder-dmclone'
