"""``python -m fedhet.parties party|host ...``: a party or host process (:mod:`fedhet.parties.entry`)."""
from fedhet.parties.entry import main
from fedhet.parties.runtime import exit_now

exit_now(main())   # its records are written: a party exits now, not after freeing its heap
