/* A small S3 client for the CDC archive (issue #22): the few S3 operations the archive
 * needs, over libcurl, each request signed with AWS Signature Version 4 by libcurl itself
 * (CURLOPT_AWS_SIGV4; no signing or HTTP code of ours), path-style URLs
 * (ENDPOINT/BUCKET/KEY) so that any S3-compatible service works (Ceph RGW, MinIO, AWS).
 *
 * API reference: https://docs.aws.amazon.com/AmazonS3/latest/API/ (ListObjectsV2,
 * PutObject, GetObject, CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
 * AbortMultipartUpload); SigV4: https://docs.aws.amazon.com/IAM/latest/UserGuide/
 * reference_sigv4-create-signed-request.html.
 *
 * Integrity: every request carries x-amz-content-sha256, the SHA-256 of its payload, which
 * is part of the signature and checked by the server. Objects are stored with their
 * SHA-256 as user metadata (x-amz-meta-sha256, hex); a GET recomputes it over the body and
 * refuses a mismatch or a missing value (SDB_ECORRUPT).
 *
 * Faults: connection errors, timeouts, HTTP 5xx, 408 and 429 are retried up to
 * CDC_S3_ATTEMPTS times with exponential backoff (100 ms doubling up to 2 s, jittered).
 * Other HTTP errors fail at once. Every error message names the operation, the bucket and
 * the key, the HTTP status and the S3 error code (e.g. "s3 GetObject s3://b/k: HTTP 403
 * SignatureDoesNotMatch: ...").
 *
 * Threading: a cdc_s3 may be used by several threads at once; each request takes a curl
 * handle from a small pool (connections are reused) and runs in parallel with the others.
 */
#ifndef SDB_CDC_S3_H
#define SDB_CDC_S3_H

#include <stddef.h>
#include <stdint.h>

/* Bodies larger than this are uploaded with a multipart upload in parts of this size
 * (S3's minimum part size is 5 MiB), CDC_S3_PART_THREADS parts at a time. */
#define CDC_S3_PART_BYTES (8u * 1024 * 1024)
/* Parts of one upload sent at the same time (each thread holds one part in memory). */
#define CDC_S3_PART_THREADS 4
/* Tries per request (first try included). */
#define CDC_S3_ATTEMPTS 6
/* Largest ListObjectsV2 response page accepted (bytes). */
#define CDC_S3_MAX_XML (16u * 1024 * 1024)

/* Where and as whom. Strings are copied by cdc_s3_open. */
typedef struct cdc_s3_conf {
	const char *endpoint;         /* "http://127.0.0.1:7480" or "https://s3.amazonaws.com" */
	const char *region;           /* signing region, "us-east-1" when NULL */
	const char *credentials_file; /* AWS shared credentials file (INI, profile AWS_PROFILE
					 or "default": aws_access_key_id,
					 aws_secret_access_key, aws_session_token); NULL: the
					 AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
					 AWS_SESSION_TOKEN environment variables */
} cdc_s3_conf;

typedef struct cdc_s3 cdc_s3;

/* Open a client of bucket. Reads the credentials, sends no request. Errors: SDB_EINVAL (no
 * endpoint, bad bucket name), SDB_EAUTH (no credentials), SDB_EIO (credentials file
 * unreadable). Free with cdc_s3_close. */
int cdc_s3_open(const char *bucket, const cdc_s3_conf *conf, cdc_s3 **out, char *err,
		size_t errlen);
void cdc_s3_close(cdc_s3 *s);
const char *cdc_s3_bucket(const cdc_s3 *s);

/* Check that the bucket exists and the credentials are accepted (ListObjectsV2,
 * max-keys=1). Errors: SDB_EAUTH (HTTP 403: wrong key or secret, no permission),
 * SDB_ENOTFOUND (NoSuchBucket), SDB_EUNAVAILABLE (endpoint down after the retries),
 * SDB_EPROTO. */
int cdc_s3_check(cdc_s3 *s, char *err, size_t errlen);

/* Upload the file at path as object key, with its SHA-256 as metadata; multipart beyond
 * CDC_S3_PART_BYTES (an unfinished multipart upload is aborted). Returns only after the
 * server confirmed the object. Replaces an existing object. Errors: as cdc_s3_check, and
 * SDB_EIO (file unreadable). */
int cdc_s3_put_file(cdc_s3 *s, const char *key, const char *path, char *err, size_t errlen);

/* Download object key to path (written to path.tmp, SHA-256 checked against the object's
 * metadata, fsync'd, renamed). Errors: SDB_ENOTFOUND (NoSuchKey), SDB_ECORRUPT (checksum
 * mismatch or missing), SDB_EIO, and as cdc_s3_check. */
int cdc_s3_get_file(cdc_s3 *s, const char *key, const char *path, char *err, size_t errlen);

/* Delete object key (DeleteObject; a key that is not there is not an error). Errors: as
 * cdc_s3_check. */
int cdc_s3_delete(cdc_s3 *s, const char *key, char *err, size_t errlen);

/* Keys under prefix, in S3's (lexicographic) order, all pages. *keys is a heap array of
 * heap strings (free each, then the array); *n may be 0. Errors: as cdc_s3_check. */
int cdc_s3_list(cdc_s3 *s, const char *prefix, char ***keys, size_t *n, char *err,
		size_t errlen);

#endif
