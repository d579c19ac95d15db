from stages.train import _main

_main()
