"""The benchmark's protocol and what it reports, one module per step, each importing only those before it:
``config`` → ``stats`` → ``results`` → ``workspace`` → ``report`` → ``figures`` → ``datasets`` →
``sweeps`` → ``policy`` → ``frames`` → ``protocol`` (collect / imagine / train / report / bench)."""
