"""Ingestion: readers, chunking, embedding batches and transactional COPY writes."""
