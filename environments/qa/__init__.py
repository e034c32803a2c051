"""Multi-hop QA (HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle): the env, its loaders, BM25 retrieval, answer
scoring and the scripted expert."""
