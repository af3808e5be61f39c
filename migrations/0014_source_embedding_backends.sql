-- Which embedding backends computed a source's stored vectors ("onnx-int8", "torch"): the same model on
-- either backend gives vectors with cosine >= 0.99, so the backend is not part of the model's identity, but
-- `agentdb sources` says which one embedded a source. Empty: not known (loaded from a pack that did not
-- say, or vectors supplied by the caller).
alter table agentdb.sources add column embedding_backends text[] not null default '{}';
