# The agentdb API image (docker-compose.yml builds it): dependencies are installed once, at build time.
FROM python:3.11-slim
WORKDIR /app
# torch first and pinned, from the CPU index: an unpinned torch pulls a multi-gigabyte GPU build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY . .
# A regular (wheel) install: the SQL, migrations, playground and demo pack ship inside the package.
RUN pip install --no-cache-dir .
EXPOSE 8080
CMD ["agentdb", "serve", "--host", "0.0.0.0", "--port", "8080"]
