"""The results, as plain torch-free records: a trace, a generation, a translation, a check report, and
their one reader and writer (`storage`). Producers in `attnscope.tracing` make them; views, the web app and
saved files read them."""
