"""The results, as plain torch-free records: a trace, a generation, a translation, a check report, and
their one file reader and writer (`files`). Producers in `attnscope.tracing` make them; views, the web app and
saved files read them."""
