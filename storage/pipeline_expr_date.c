/* The date operators of the expression language (issue #20, pipeline_ext.h): $year ...
 * $isoDayOfWeek, $dateToString, $dateToParts, and the ISO-8601 printing and parsing that
 * $toString/$toDate/$convert use, with MongoDB 6.0's rules, codes and messages
 * (expression.cpp, query/datetime/date_time_support.cpp). Calendar arithmetic is the
 * proleptic Gregorian calendar on int64 milliseconds (any date, before 1970 or far
 * future), computed without the C library's time zone or locale: shard replica-set
 * members replicate commands, so every member must compute the same result. Time zones:
 * UTC (and its Olson aliases UTC, GMT, Etc/UTC, Etc/GMT, Z) and fixed offsets "+hh",
 * "+hhmm", "+hh:mm" (and '-'); other Olson names are refused with 238 NotImplemented, as
 * stripedb carries no time zone database. */
#include "storage/pipeline_ext.h"

#define MS_PER_DAY INT64_C(86400000)

static int64_t floor_div(int64_t a, int64_t b)
{
	int64_t q = a / b;

	return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* Days since 1970-01-01 of y-m-d (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d)
{
	int64_t era, yoe, doy, doe;

	y -= m <= 2;
	era = floor_div(y, 400);
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
	int64_t era, doe, yoe, doy, mp;

	z += 719468;
	era = floor_div(z, 146097);
	doe = z - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	*y = yoe + era * 400;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	*d = (int)(doy - (153 * mp + 2) / 5 + 1);
	*m = (int)(mp < 10 ? mp + 3 : mp - 9);
	*y += *m <= 2;
}

static bool leap(int64_t y)
{
	return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* The broken-down fields of a local time. */
typedef struct {
	int64_t year;
	int month, day, hour, minute, second, ms;
	int yday;    /* 1..366 */
	int wday;    /* 0 = Sunday .. 6 */
	int64_t days; /* since the epoch */
} dparts;

static void split_ms(int64_t ms, dparts *p)
{
	int64_t days = floor_div(ms, MS_PER_DAY);
	int64_t rem = ms - days * MS_PER_DAY;

	civil_from_days(days, &p->year, &p->month, &p->day);
	p->days = days;
	p->hour = (int)(rem / 3600000);
	p->minute = (int)(rem / 60000 % 60);
	p->second = (int)(rem / 1000 % 60);
	p->ms = (int)(rem % 1000);
	p->yday = (int)(days - days_from_civil(p->year, 1, 1) + 1);
	p->wday = (int)(((days % 7) + 11) % 7); /* 1970-01-01 was a Thursday */
}

/* ISO 8601 week-numbering year and week of p. */
static void iso_week(const dparts *p, int64_t *iy, int *iw)
{
	int isodow = p->wday == 0 ? 7 : p->wday;
	int w = (p->yday - isodow + 10) / 7;

	*iy = p->year;
	if (w < 1) {
		/* the last week of the previous year: 53 when its Dec 31 is a Thursday, or a
		 * Friday of a leap year */
		int64_t py = p->year - 1;
		int dec31 = (int)(((days_from_civil(py, 12, 31) % 7) + 11) % 7);

		*iy = py;
		w = (dec31 == 4 || (dec31 == 5 && leap(py))) ? 53 : 52;
	} else if (w == 53) {
		int dec31 = (int)(((days_from_civil(p->year, 12, 31) % 7) + 11) % 7);

		if (!(dec31 == 4 || (dec31 == 5 && leap(p->year)))) { /* a 52-week year */
			*iy = p->year + 1;
			w = 1;
		}
	}
	*iw = w;
}

void agg_date_iso(int64_t ms, char *buf, size_t len)
{
	dparts p;

	split_ms(ms, &p);
	snprintf(buf, len, "%04lld-%02d-%02dT%02d:%02d:%02d.%03dZ", (long long)p.year, p.month,
		 p.day, p.hour, p.minute, p.second, p.ms);
}

/* ---- parsing ---- */

static bool digits(const char *s, size_t len, size_t at, int n, int *out)
{
	int v = 0;

	if (at + (size_t)n > len) {
		return false;
	}
	for (int i = 0; i < n; i++) {
		if (s[at + i] < '0' || s[at + i] > '9') {
			return false;
		}
		v = v * 10 + (s[at + i] - '0');
	}
	*out = v;
	return true;
}

/* "+hh", "+hhmm", "+hh:mm" (or '-') at s: the offset in minutes. Returns: 0, or -1. */
static int parse_offset(const char *s, size_t len, int *minutes)
{
	int h = 0, m = 0;

	if (len < 3 || (s[0] != '+' && s[0] != '-') || !digits(s, len, 1, 2, &h)) {
		return -1;
	}
	if (len == 3) {
		m = 0;
	} else if (len == 5 && digits(s, len, 3, 2, &m)) {
	} else if (len == 6 && s[3] == ':' && digits(s, len, 4, 2, &m)) {
	} else {
		return -1;
	}
	if (h > 99 || m > 59) {
		return -1;
	}
	*minutes = (s[0] == '-' ? -1 : 1) * (h * 60 + m);
	return 0;
}

int agg_date_parse_iso(const char *s, size_t len, int64_t *ms, char *why, size_t whylen)
{
	int y, mo, d, h = 0, mi = 0, sec = 0, frac = 0, off = 0;
	size_t i = 10;

	if (why != NULL && whylen > 0) {
		why[0] = '\0';
	}
	if (!digits(s, len, 0, 4, &y) || len < 10 || s[4] != '-' || !digits(s, len, 5, 2, &mo) ||
	    s[7] != '-' || !digits(s, len, 8, 2, &d)) {
		snprintf(why, whylen, "stripedb parses ISO 8601 dates (YYYY-MM-DD[THH:MM[:SS[.mmm]]][Z|+hh:mm]) without a format");
		return -1;
	}
	if (mo < 1 || mo > 12 || d < 1 ||
	    d > (int)(days_from_civil(mo == 12 ? y + 1 : y, mo == 12 ? 1 : mo + 1, 1) -
		      days_from_civil(y, mo, 1))) {
		snprintf(why, whylen, "The parsed date was invalid");
		return -1;
	}
	if (i < len && (s[i] == 'T' || s[i] == ' ')) {
		if (!digits(s, len, i + 1, 2, &h) || i + 3 >= len || s[i + 3] != ':' ||
		    !digits(s, len, i + 4, 2, &mi)) {
			snprintf(why, whylen, "Unexpected data found after the date");
			return -1;
		}
		i += 6;
		if (i < len && s[i] == ':') {
			if (!digits(s, len, i + 1, 2, &sec)) {
				snprintf(why, whylen, "Unexpected data found after the time");
				return -1;
			}
			i += 3;
			if (i < len && s[i] == '.') {
				int scale = 100, n = 0;

				i++;
				while (i < len && s[i] >= '0' && s[i] <= '9') {
					frac += (s[i] - '0') * scale;
					scale /= 10;
					i++;
					n++;
				}
				if (n == 0) {
					snprintf(why, whylen, "Unexpected data found after the time");
					return -1;
				}
			}
		}
		if (h > 23 || mi > 59 || sec > 59) {
			snprintf(why, whylen, "The parsed time was invalid");
			return -1;
		}
		if (i + 1 < len && s[i] == ' ' && (s[i + 1] == 'Z' || s[i + 1] == '+' || s[i + 1] == '-')) {
			i++;
		}
		if (i < len && s[i] == 'Z' && i + 1 == len) {
			i++;
		} else if (i < len && parse_offset(s + i, len - i, &off) == 0) {
			i = len;
		}
	}
	if (i != len) {
		snprintf(why, whylen, "Trailing data");
		return -1;
	}
	*ms = days_from_civil(y, mo, d) * MS_PER_DAY + (int64_t)h * 3600000 + (int64_t)mi * 60000 +
	      (int64_t)sec * 1000 + frac - (int64_t)off * 60000;
	return 0;
}

/* ---- operands ---- */

/* The time zone at tz (a string) into *offset_min. Errors: 40517 not a string, 40485 an
 * unknown identifier, 238 an Olson name other than UTC's. */
static int parse_tz(const docbuild_node *tz, int *offset_min, const ectx *e)
{
	static const char *const utc[] = {"UTC", "GMT", "Etc/UTC", "Etc/GMT", "Z", "Etc/Universal",
					  "Universal", "Etc/Zulu", "Zulu", "UCT", "Etc/UCT"};
	const char *s;
	size_t len;

	if (tz->type != BSON_TYPE_UTF8) {
		return efail(e, 40517, "timezone must evaluate to a string, found %s", type_name(tz->type));
	}
	s = tz->value.value.v_utf8.str;
	len = tz->value.value.v_utf8.len;
	for (size_t i = 0; i < sizeof utc / sizeof utc[0]; i++) {
		if (strlen(utc[i]) == len && memcmp(utc[i], s, len) == 0) {
			*offset_min = 0;
			return 0;
		}
	}
	if (parse_offset(s, len, offset_min) == 0) {
		return 0;
	}
	if (len > 0 && ((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z'))) {
		return efail(e, C_NOT_IMPLEMENTED,
			     "time zone '%.*s' is not supported by stripedb: only UTC and fixed offsets "
			     "such as '+05:30' are (stripedb carries no time zone database)",
			     (int)(len > 100 ? 100 : len), s);
	}
	return efail(e, 40485, "unrecognized time zone identifier: \"%.*s\"", (int)(len > 100 ? 100 : len),
		     s);
}

/* Value::coerceToDate: a date, a timestamp (seconds) or an ObjectId (its time). */
static int coerce_date(const docbuild_node *v, int64_t *ms, const ectx *e)
{
	switch (v->type) {
	case BSON_TYPE_DATE_TIME:
		*ms = v->value.value.v_datetime;
		return 0;
	case BSON_TYPE_TIMESTAMP:
		*ms = (int64_t)v->value.value.v_timestamp.timestamp * 1000;
		return 0;
	case BSON_TYPE_OID:
		*ms = (int64_t)bson_oid_get_time_t(&v->value.value.v_oid) * 1000;
		return 0;
	default:
		return efail(e, 16006, "can't convert from BSON type %s to Date", type_name(v->type));
	}
}

/* The local time of ms at offset minutes (saturating: no int64 overflow). */
static int64_t local_ms(int64_t ms, int offset_min)
{
	int64_t r;

	if (__builtin_add_overflow(ms, (int64_t)offset_min * 60000, &r)) {
		return ms < 0 ? INT64_MIN : INT64_MAX;
	}
	return r;
}

/* ---- $dateToString ---- */

/* A growable output string. */
typedef struct {
	char *p;
	size_t len, cap;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->p = sdb_realloc(b->p, b->cap);
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void put_padded(sbuf_t *b, int64_t v, int width)
{
	char tmp[32];

	snprintf(tmp, sizeof tmp, "%0*lld", width, (long long)v);
	sb_add(b, tmp, strlen(tmp));
}

/* The format string's check (checkFormatString). */
static int check_format(const char *f, size_t len, const ectx *e)
{
	for (size_t i = 0; i < len; i++) {
		if (f[i] != '%') {
			continue;
		}
		if (i + 1 == len) {
			return efail(e, 18535, "Unmatched '%%' at end of format string");
		}
		i++;
		if (strchr("dGHjLmMSuUVwYzZ%", f[i]) == NULL || f[i] == '\0') {
			return efail(e, 18536, "Invalid format character '%%%c' in format string", f[i]);
		}
	}
	return 0;
}

static int format_date(const char *f, size_t len, int64_t utc_ms, int off, sbuf_t *b, const ectx *e)
{
	dparts p;
	int64_t iy;
	int iw;

	split_ms(local_ms(utc_ms, off), &p);
	iso_week(&p, &iy, &iw);
	for (size_t i = 0; i < len; i++) {
		int64_t v = 0;
		int w = 2;

		if (f[i] != '%') {
			sb_add(b, f + i, 1);
			continue;
		}
		i++;
		switch (f[i]) {
		case '%':
			sb_add(b, "%", 1);
			continue;
		case 'Y': v = p.year; w = 4; break;
		case 'G': v = iy; w = 4; break;
		case 'm': v = p.month; break;
		case 'd': v = p.day; break;
		case 'H': v = p.hour; break;
		case 'M': v = p.minute; break;
		case 'S': v = p.second; break;
		case 'L': v = p.ms; w = 3; break;
		case 'j': v = p.yday; w = 3; break;
		case 'w': v = p.wday + 1; w = 1; break;
		case 'u': v = p.wday == 0 ? 7 : p.wday; w = 1; break;
		case 'U': v = (p.yday - 1 + 7 - p.wday) / 7; break;
		case 'V': v = iw; break;
		case 'z': {
			int a = off < 0 ? -off : off;

			sb_add(b, off < 0 ? "-" : "+", 1);
			put_padded(b, a / 60, 2);
			put_padded(b, a % 60, 2);
			continue;
		}
		case 'Z':
			if (off < 0) {
				sb_add(b, "-", 1);
			}
			put_padded(b, off < 0 ? -off : off, 3);
			continue;
		default:
			break;
		}
		if (v < 0 || v > 9999) {
			return efail(e, 18537,
				     "Could not convert date to string: date component was outside the supported range of 0-9999: %lld",
				     (long long)v);
		}
		put_padded(b, v, w);
	}
	return 0;
}

/* ---- dispatch ---- */

static int eval_part(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	int64_t ms, iy;
	int off = 0, iw, rc;
	dparts p;

	if (is_nullish(v[0]) || (!ext_absent(x->args[1]) && is_nullish(v[1]))) {
		*out = v_null();
		return 0;
	}
	if (!ext_absent(x->args[1]) && (rc = parse_tz(v[1], &off, e)) != 0) {
		return rc;
	}
	if ((rc = coerce_date(v[0], &ms, e)) != 0) {
		return rc;
	}
	split_ms(local_ms(ms, off), &p);
	switch (x->ext) {
	case E_YEAR:
		*out = v_int32((int32_t)p.year);
		break;
	case E_MONTH: *out = v_int32(p.month); break;
	case E_DAYOFMONTH: *out = v_int32(p.day); break;
	case E_DAYOFWEEK: *out = v_int32(p.wday + 1); break;
	case E_DAYOFYEAR: *out = v_int32(p.yday); break;
	case E_HOUR: *out = v_int32(p.hour); break;
	case E_MINUTE: *out = v_int32(p.minute); break;
	case E_SECOND: *out = v_int32(p.second); break;
	case E_MILLISECOND: *out = v_int32(p.ms); break;
	case E_WEEK: *out = v_int32((p.yday - 1 + 7 - p.wday) / 7); break;
	case E_ISODAYOFWEEK: *out = v_int32(p.wday == 0 ? 7 : p.wday); break;
	default:
		iso_week(&p, &iy, &iw);
		*out = x->ext == E_ISOWEEK ? v_int32(iw) : v_int32((int32_t)iy);
		break;
	}
	return 0;
}

static void put_field(docbuild_node *d, const char *k, int64_t v)
{
	docbuild_node *n = v_int32((int32_t)v);

	docbuild_set_key(n, k);
	docbuild_push(d, n);
}

int agg_date_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node *v[12] = {NULL};
	int rc = 0, off = 0;
	int64_t ms;

	*out = NULL;
	for (size_t i = 0; i < x->n && i < 12 && rc == 0; i++) {
		/* $dateToString's onNull is evaluated only when needed */
		if (x->ext == E_DATETOSTRING && i == 3) {
			break;
		}
		rc = ext_arg(x, i, root, &v[i], e);
	}
	if (rc != 0) {
		goto done;
	}
	switch (x->ext) {
	case E_DATETOSTRING: {
		/* args: date, format, timezone, onNull */
		const char *f = "%Y-%m-%dT%H:%M:%S.%LZ";
		size_t flen = strlen(f);
		sbuf_t b = {0};

		if (!ext_absent(x->args[1])) {
			if (is_nullish(v[1])) {
				*out = v_null();
				break;
			}
			if (v[1]->type != BSON_TYPE_UTF8) {
				char show[200];

				rc = efail(e, 18533, "$dateToString requires that 'format' be a string, found: %s with value %s",
					   type_name(v[1]->type), ext_show(v[1], show, sizeof show));
				break;
			}
			f = v[1]->value.value.v_utf8.str;
			flen = v[1]->value.value.v_utf8.len;
			if ((rc = check_format(f, flen, e)) != 0) {
				break;
			}
		}
		if (!ext_absent(x->args[2])) {
			if (is_nullish(v[2])) {
				*out = v_null();
				break;
			}
			if ((rc = parse_tz(v[2], &off, e)) != 0) {
				break;
			}
			if (ext_absent(x->args[1]) && off != 0) {
				f = "%Y-%m-%dT%H:%M:%S.%L";
				flen = strlen(f);
			}
		}
		if (is_nullish(v[0])) {
			if (!ext_absent(x->args[3])) {
				rc = ext_arg(x, 3, root, out, e);
			} else {
				*out = v_null();
			}
			break;
		}
		if ((rc = coerce_date(v[0], &ms, e)) != 0) {
			break;
		}
		rc = format_date(f, flen, ms, off, &b, e);
		if (rc == 0) {
			*out = v_string(b.p != NULL ? b.p : "", b.len);
		}
		free(b.p);
		break;
	}
	case E_DATETOPARTS: {
		/* args: date, timezone, iso8601 */
		bool iso = false;
		dparts p;
		docbuild_node *d;

		if (!ext_absent(x->args[2]) && !is_nullish(v[2])) {
			if (v[2]->type != BSON_TYPE_BOOL) {
				rc = efail(e, 40521, "iso8601 must evaluate to a bool, found %s",
					   type_name(v[2]->type));
				break;
			}
			iso = v[2]->value.value.v_bool;
		}
		if (is_nullish(v[0]) || (!ext_absent(x->args[1]) && is_nullish(v[1])) ||
		    (!ext_absent(x->args[2]) && is_nullish(v[2]))) {
			*out = v_null();
			break;
		}
		if (!ext_absent(x->args[1]) && (rc = parse_tz(v[1], &off, e)) != 0) {
			break;
		}
		if ((rc = coerce_date(v[0], &ms, e)) != 0) {
			break;
		}
		split_ms(local_ms(ms, off), &p);
		d = docbuild_new_doc(NULL);
		if (iso) {
			int64_t iy;
			int iw;

			iso_week(&p, &iy, &iw);
			put_field(d, "isoWeekYear", iy);
			put_field(d, "isoWeek", iw);
			put_field(d, "isoDayOfWeek", p.wday == 0 ? 7 : p.wday);
		} else {
			put_field(d, "year", p.year);
			put_field(d, "month", p.month);
			put_field(d, "day", p.day);
		}
		put_field(d, "hour", p.hour);
		put_field(d, "minute", p.minute);
		put_field(d, "second", p.second);
		put_field(d, "millisecond", p.ms);
		*out = d;
		break;
	}
	default:
		rc = eval_part(x, v, out, e);
		break;
	}
done:
	for (size_t i = 0; i < 12; i++) {
		docbuild_free(v[i]);
	}
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}
