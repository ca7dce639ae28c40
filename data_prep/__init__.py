from data_prep.layers import register_resolvers

register_resolvers()  # the config's ${eagle3_layers:...} / ${layers_tag:...} / ${offset_tag:...} resolve wherever data_prep is imported
